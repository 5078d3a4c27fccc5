"""Rank 0's data set is slow: each sample costs COST s of a DataLoader worker's CPU (two
workers, batches of 2), while DDP trains with a TIMEOUT s group timeout (argv: TIMEOUT COST).
Rank 0's main thread waits for its workers (no CPU of its own), so with COST past TIMEOUT
rank 1 times out in its first backward on real Gloo and torchrun's agent SIGTERMs rank 0
before its first batch. The simulator counted none of the wait: every rank completed."""
import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset


class Slow(Dataset):
    def __init__(self, rank, cost):
        self.rank, self.cost = rank, cost

    def __len__(self):
        return 8

    def __getitem__(self, i):
        if self.rank == 0:
            t0 = time.thread_time()
            while time.thread_time() - t0 < self.cost:
                pass
        return torch.full((4,), float(i)), torch.tensor([float(i)])


def main():
    timeout, cost = float(sys.argv[1]), float(sys.argv[2])
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    loader = DataLoader(Slow(rank, cost), batch_size=2, num_workers=2)
    for step, (x, y) in enumerate(loader):
        loss = F.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"rank {rank} step {step}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
