"""A CUDA prefetcher as GPU training code writes it: a background thread builds the next
batch on the GPU (torch.randn(..., device=device)) and moves targets with .to(device,
non_blocking=True) while the main thread trains with DDP.

    torchrun --nproc-per-node 2 examples/cuda_prefetch_thread.py
    simdist compare examples/cuda_prefetch_thread.py --nproc-per-node 2
"""

import queue
import threading

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def producer(q, device, rank, steps):
    g = torch.Generator().manual_seed(rank)
    for _ in range(steps):
        x = torch.randn(8, 4, generator=g).to(device, non_blocking=True)
        noise = torch.zeros(8, 1, device=device)
        y = x.sum(dim=1, keepdim=True) + noise
        q.put((x, y))
    q.put(None)


def main():
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    q = queue.Queue(maxsize=2)
    t = threading.Thread(target=producer, args=(q, device, rank, 4), daemon=True)
    t.start()
    step = 0
    while (batch := q.get()) is not None:
        x, y = batch
        opt.zero_grad()
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        step += 1
    t.join()
    w = model.module.weight.detach().clone()
    dist.all_reduce(w)
    print(f"rank {rank}: {step} steps on {x.device.type}, weight sum {w.sum().item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
