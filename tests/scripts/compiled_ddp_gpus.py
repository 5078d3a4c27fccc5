"""DDP then `torch.compile(model)` on the GPUs, as nanoGPT's `--compile=True` does: the same
2-layer MLP trained three steps by each of `--variants` in turn (a `torch.compile` backend,
"eager", "aot_eager" or "inductor", its default, or "uncompiled"), each in its own DDP on
`cuda:LOCAL_RANK`. The second forward rebuilds DDP's buckets (a broadcast of the bucket
indices from rank 0) under dynamo's frame hook; the first compiled model of a process is the
one that meets a cold dynamo. `--wrap none` averages the gradients by hand (an `all_reduce`
of each) instead of DDP. Each rank prints, per variant, its losses, a checksum of its
parameters and their device. `--device cpu` runs the same program on the host. Started
torchrun-style."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def train(variant: str, device: torch.device, rank: int, on_gpu: bool, wrap: str) -> None:
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(device)
    model = DDP(net, device_ids=[device.index] if on_gpu else None) if wrap == "ddp" else net
    if variant != "uncompiled":
        model = torch.compile(model, backend=variant)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(10 + rank)
    losses = []
    for _ in range(3):
        x, y = torch.randn(4, 8, generator=g).to(device), torch.randn(4, 2, generator=g).to(device)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if wrap == "none":
            for q in net.parameters():
                dist.all_reduce(q.grad)
                q.grad /= dist.get_world_size()
        opt.step()
        losses.append(round(loss.item(), 5))
    checksum = sum(q.detach().double().sum() for q in net.parameters()).item()
    where = next(model.parameters()).device
    print(f"[rank{rank}] {variant}: losses {losses} checksum {checksum:.6f} on {where}", flush=True)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    p.add_argument("--variants", nargs="+", default=["eager", "aot_eager", "uncompiled"],
                   choices=["eager", "aot_eager", "inductor", "uncompiled"])
    p.add_argument("--wrap", default="ddp", choices=["ddp", "none"])
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    on_gpu = args.device == "cuda"
    if on_gpu:
        torch.cuda.set_device(local)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    device = torch.device("cuda", local) if on_gpu else torch.device("cpu")
    for variant in args.variants:
        train(variant, device, rank, on_gpu, args.wrap)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
