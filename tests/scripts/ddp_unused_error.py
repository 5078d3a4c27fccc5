"""A torchrun-style DDP script whose model has a branch only some steps take, trained first
as people first write it (find_unused_parameters=False: DDP raises on the step after the
branch was skipped, on every rank), then with SyncBatchNorm converted in (refused on the
CPU), then with find_unused_parameters=True (trains), then with static_graph=True. Any
world size >= 2."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.body = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.head = nn.Linear(8, 2)
        self.extra = nn.Linear(8, 2)

    def forward(self, x, extra=True):
        h = F.relu(self.bn(self.body(x)))
        return self.head(h) + (self.extra(h) if extra else 0)


def train(ddp, rank, steps, tag, extra_on):
    opt = torch.optim.SGD(ddp.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(steps):
        x, y = torch.randn(4, 6, generator=g), torch.randint(0, 2, (4,), generator=g)
        try:
            loss = F.cross_entropy(ddp(x, extra_on(step)), y)
            loss.backward()
        except RuntimeError as e:
            print(f"[{tag} rank{rank}] step {step}: {type(e).__name__}: {str(e).splitlines()[0]}", flush=True)
            return False
        opt.step()
        opt.zero_grad()
        print(f"[{tag} rank{rank}] step {step} loss {loss.item():.8f}", flush=True)
    return True


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = int(os.environ["RANK"])

    torch.manual_seed(0)
    ddp = DDP(Net())
    train(ddp, rank, args.steps, "strict", lambda step: step != 1)  # the branch skipped on step 1

    torch.manual_seed(0)
    sync = nn.SyncBatchNorm.convert_sync_batchnorm(Net())
    try:
        train(DDP(sync, find_unused_parameters=True), rank, 1, "syncbn", lambda step: True)
    except ValueError as e:
        print(f"[syncbn rank{rank}] ValueError: {e}", flush=True)

    torch.manual_seed(0)
    ddp = DDP(Net(), find_unused_parameters=True)
    train(ddp, rank, args.steps, "unused", lambda step: step % 2 == 0)

    torch.manual_seed(0)
    ddp = DDP(Net(), static_graph=True)
    train(ddp, rank, args.steps, "static", lambda step: True)
    digest = sum(p.detach().sum() for p in ddp.parameters())
    print(f"[static rank{rank}] params {digest.item():.8f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
