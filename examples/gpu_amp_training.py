"""A GPU training script run unmodified on CPU ranks: torch.cuda.set_device, eager
initialisation with init_process_group("nccl", device_id=...), barrier(device_ids=[...]),
DDP with device_ids, mixed precision (torch.autocast("cuda", bfloat16) and a GradScaler),
CUDA events for timing, all_gather_object of per-rank stats.

    torchrun --nproc-per-node 2 examples/gpu_amp_training.py
    simdist compare examples/gpu_amp_training.py --nproc-per-node 2
"""
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    device = torch.device(f"cuda:{local_rank}")
    dist.init_process_group("nccl", device_id=device)
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier(device_ids=[local_rank])
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(8, 2).to(device), device_ids=[local_rank], output_device=local_rank)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    scaler = torch.amp.GradScaler("cuda")
    start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    g = torch.Generator().manual_seed(rank)
    start.record()
    for step in range(3):
        x = torch.randn(16, 8, generator=g).to(device, non_blocking=True)
        y = torch.randint(0, 2, (16,), generator=g).cuda(non_blocking=True)
        with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
            loss = F.cross_entropy(model(x), y)
        opt.zero_grad(set_to_none=True)
        scaler.scale(loss).backward()
        scaler.step(opt)
        scaler.update()
    end.record()
    torch.cuda.synchronize()
    stats = [None] * world
    dist.all_gather_object(stats, {"rank": rank, "loss": round(loss.item(), 4)})
    w = model.module.weight.detach().clone()
    dist.all_reduce(w, op=dist.ReduceOp.AVG)
    if rank == 0:
        print(f"stats {stats}, weight mean {w.mean().item():.6f}, mem {torch.cuda.max_memory_allocated()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
