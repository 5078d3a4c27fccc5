"""DDP with uneven inputs under model.join(divide_by_initial_world_size=False): each rank has
a different number of batches (rank r: 3 + r); once a rank runs out, the gradients are averaged
over the ranks still training (the reducer reads the count of those from the work of Join's
all-reduce, through its future). Prints per-step losses and a parameter digest per rank.
Any world size >= 2.

    --throw   join(throw_on_early_termination=True): every rank raises once one runs out
"""
import argparse

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--throw", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 1)))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(100 + rank)
    batches = [(torch.randn(4, 6, generator=g), torch.randn(4, 1, generator=g)) for _ in range(3 + rank)]
    try:
        with model.join(divide_by_initial_world_size=False, throw_on_early_termination=args.throw):
            for step, (x, y) in enumerate(batches):
                opt.zero_grad()
                loss = nn.functional.mse_loss(model(x), y)
                loss.backward()
                opt.step()
                print(f"rank {rank} step {step} loss {loss.item():.6f}", flush=True)
    except RuntimeError as e:
        print(f"rank {rank}: stopped: {str(e)[:70]}", flush=True)
    digest = sum(p.detach().double().sum().item() for p in model.parameters())
    print(f"rank {rank}: digest {digest:.10f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
