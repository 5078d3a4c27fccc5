"""Logging the global mean loss every k steps -- but only rank 0 calls the all_reduce.

The bug: the all_reduce sits inside `if rank == 0:` with the print. Rank 0's logging
all_reduce (one float) is then paired with the other ranks' next collective, which is
DDP's gradient all-reduce of a whole bucket: the sizes differ and the collectives of the
ranks are off by one from there on.

    torchrun --nproc-per-node 2 examples/log_loss_rank0_only.py
    simdist run examples/log_loss_rank0_only.py --nproc-per-node 2
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=6)
    p.add_argument("--log-every", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=8)
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


def main():
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    device = torch.device(f"cuda:{local_rank}") if backend == "nccl" else torch.device("cpu")

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.steps * args.batch_size * world, 10, generator=g)
    y = (x[:, :3].sum(dim=1, keepdim=True) > 0).float()
    sampler = DistributedSampler(TensorDataset(x, y), shuffle=True, seed=1)
    loader = DataLoader(TensorDataset(x, y), batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(10, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device))
    opt = torch.optim.Adam(model.parameters(), lr=args.lr)

    for step, (xb, yb) in enumerate(loader, start=1):
        opt.zero_grad()
        loss = F.binary_cross_entropy_with_logits(model(xb.to(device)), yb.to(device))
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step}: local loss {loss.item():.6f}")
        if rank == 0 and step % args.log_every == 0:
            mean = loss.detach().clone()
            dist.all_reduce(mean, op=dist.ReduceOp.SUM)  # BUG: the other ranks never call it
            mean /= world
            print(f"step {step}: mean loss {mean.item()!r}")
    print(f"rank {rank}: done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
