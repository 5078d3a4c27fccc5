"""Evaluation between epochs: a barrier, then a metric all-reduced on a subgroup.

Four ranks train a classifier with DDP. After each epoch every rank waits at a barrier
(checkpoint written by rank 0); then only the evaluation ranks (the first half, a
`new_group`) score their half of the validation set and all-reduce the number of correct
predictions on that subgroup; rank 0 prints the accuracy. Every rank creates the
subgroup, as torch requires, and only its members call collectives on it.

    torchrun --nproc-per-node 4 examples/eval_barrier_subgroup.py
    simdist run examples/eval_barrier_subgroup.py --nproc-per-node 4
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=2)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.2)
    return p.parse_args()


def make_data(seed, n):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 5, generator=g)
    return x, (x[:, 0] - x[:, 1] > 0).long()


def main():
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    device = torch.device(f"cuda:{local_rank}") if backend == "nccl" else torch.device("cpu")
    eval_ranks = list(range(max(1, world // 2)))
    eval_group = dist.new_group(eval_ranks)

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(5, 2).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    x, y = make_data(seed=rank, n=8 * args.steps)
    val_x, val_y = make_data(seed=1000, n=60)

    for epoch in range(args.epochs):
        for xb, yb in zip(x.split(8), y.split(8)):
            opt.zero_grad()
            F.cross_entropy(model(xb.to(device)), yb.to(device)).backward()
            opt.step()
        dist.barrier()  # everyone finished the epoch (rank 0 would save a checkpoint here)
        if rank in eval_ranks:
            part = val_x.chunk(len(eval_ranks))[rank], val_y.chunk(len(eval_ranks))[rank]
            with torch.no_grad():
                pred = model.module(part[0].to(device)).argmax(dim=1)
            stats = torch.tensor([(pred == part[1].to(device)).sum().item(), len(part[1])], device=device)
            dist.all_reduce(stats, group=eval_group)
            if rank == 0:
                print(f"epoch {epoch}: accuracy {stats[0].item()}/{stats[1].item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
