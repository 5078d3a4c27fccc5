"""Gradient accumulation with DDP's no_sync(), under Join, with uneven data per rank.

Each rank reads its own shard; shards differ in length (rank r has `--batches + r`
micro-batches). Gradients are accumulated over `--accum` micro-batches inside
`model.no_sync()` and all-reduced on the last one. Join lets a rank that ran out of data
shadow the others' all-reduces, so the job finishes on every rank.

    torchrun --nproc-per-node 3 examples/grad_accum_join.py
    simdist run examples/grad_accum_join.py --nproc-per-node 3
"""

import argparse
import contextlib

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batches", type=int, default=6, help="micro-batches on rank 0 (rank r has batches + r)")
    p.add_argument("--accum", type=int, default=2, help="micro-batches per optimizer step")
    p.add_argument("--lr", type=float, default=0.1)
    return p.parse_args()


def main():
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    g = torch.Generator().manual_seed(100 + rank)
    shard = [(torch.randn(5, 4, generator=g), torch.randn(5, 1, generator=g)) for _ in range(args.batches + rank)]

    steps = 0
    with Join([model]):
        for i, (x, y) in enumerate(shard):
            last = (i + 1) % args.accum == 0
            ctx = contextlib.nullcontext() if last else model.no_sync()
            with ctx:
                loss = F.mse_loss(model(x.to(device)), y.to(device)) / args.accum
                loss.backward()
            if last:
                opt.step()
                opt.zero_grad()
                steps += 1
    weight = model.module[0].weight.detach().sum().item()
    print(f"rank {rank}/{world}: {len(shard)} micro-batches, {steps} optimizer steps, weight sum {weight!r}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
