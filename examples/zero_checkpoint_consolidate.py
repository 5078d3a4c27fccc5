"""Checkpointing a ZeroRedundancyOptimizer: its state is sharded, so before rank 0 can save
`optimizer.state_dict()` every rank must call consolidate_state_dict(to=0), a collective that
broadcasts each rank's shard. --bug calls it inside `if rank == 0:` next to the torch.save, as
one would for a plain optimizer: rank 0 broadcasts its shard alone while the others go on to
the barrier after saving.

    torchrun --nproc-per-node 3 examples/zero_checkpoint_consolidate.py [--bug]
    simdist compare examples/zero_checkpoint_consolidate.py --nproc-per-node 3 -- --bug
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--bug", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(6, 6), torch.nn.ReLU(), torch.nn.Linear(6, 2)))
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    g = torch.Generator().manual_seed(rank)
    for _ in range(args.steps):
        x = torch.randn(8, 6, generator=g)
        loss = F.cross_entropy(model(x), (x[:, 0] > 0).long())
        opt.zero_grad()
        loss.backward()
        opt.step()
    print(f"rank {rank}: trained, last loss {loss.item():.6f}", flush=True)
    path = "zero_ckpt.pt"
    if args.bug:
        if rank == 0:
            opt.consolidate_state_dict(to=0)
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict()}, path)
    else:
        opt.consolidate_state_dict(to=0)
        if rank == 0:
            torch.save({"model": model.module.state_dict(), "optim": opt.state_dict()}, path)
    dist.barrier()
    ckpt = torch.load(path, weights_only=False)
    steps = sorted(s["step"].item() for s in ckpt["optim"]["state"].values())
    print(f"rank {rank}: {len(ckpt['optim']['state'])} parameter states, steps {steps}", flush=True)
    dist.barrier()
    if rank == 0:
        os.remove(path)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
