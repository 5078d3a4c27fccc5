"""Validation on rank 0 only, through the DDP wrapper (model(x), not model.module(x)), while
the other ranks wait at a barrier: a model with BatchNorm, so DDP's forward broadcasts its
buffers from rank 0 (broadcast_buffers=True) even under no_grad/eval; that broadcast meets
the others' barrier, and every rank hangs. Any world size >= 2.

    --module   the fix: rank 0 evaluates model.module, which communicates nothing
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--module", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(4, 8), nn.BatchNorm1d(8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for epoch in range(2):
        model.train()
        for _ in range(3):
            x, y = torch.randn(8, 4, generator=g), torch.randn(8, 1, generator=g)
            opt.zero_grad()
            loss = nn.functional.mse_loss(model(x), y)
            loss.backward()
            opt.step()
        print(f"rank {rank} epoch {epoch}: train loss {loss.item():.6f}", flush=True)
        if rank == 0:
            model.eval()
            net = model.module if args.module else model
            with torch.no_grad():
                val = nn.functional.mse_loss(net(torch.ones(5, 4)), torch.zeros(5, 1)).item()
            print(f"epoch {epoch}: val {val:.6f}", flush=True)
        dist.barrier()
    print(f"rank {rank}: done", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
