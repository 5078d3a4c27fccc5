"""Early stopping by `break` -- decided on each rank's own validation loss.

Each rank validates on its own shard and stops when its validation loss has not improved
for `--patience` epochs. The ranks' validation losses differ, so one rank breaks out of
the training loop first; the others go on into the next epoch, whose first backward
all-reduces gradients with a rank that is no longer there. The fix is
early_stop_flag.py: all-reduce the stop decision.

    torchrun --nproc-per-node 3 examples/early_stop_break.py
    simdist run examples/early_stop_break.py --nproc-per-node 3
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--epochs", type=int, default=12)
    p.add_argument("--patience", type=int, default=2)
    p.add_argument("--lr", type=float, default=0.3)
    return p.parse_args()


def shard(rank, n, seed):
    g = torch.Generator().manual_seed(seed + rank)
    x = torch.randn(n, 6, generator=g)
    y = x @ torch.tensor([[0.5], [-1.0], [0.25], [0.0], [2.0], [-0.5]]) + 0.3 * torch.randn(n, 1, generator=g)
    return x, y


def main():
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")

    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(6, 1).to(device))
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)
    train_x, train_y = shard(rank, 32, seed=10)
    val_x, val_y = shard(rank, 8, seed=20 * (rank + 1))

    best, bad = float("inf"), 0
    for epoch in range(args.epochs):
        model.train()
        for xb, yb in zip(train_x.split(8), train_y.split(8)):
            opt.zero_grad()
            F.mse_loss(model(xb.to(device)), yb.to(device)).backward()
            opt.step()
        model.eval()
        with torch.no_grad():
            val = F.mse_loss(model(val_x.to(device)), val_y.to(device)).item()
        print(f"rank {rank} epoch {epoch}: val loss {val:.5f}")
        if val < best - 1e-3:
            best, bad = val, 0
        else:
            bad += 1
        if bad >= args.patience:
            print(f"rank {rank}: early stop at epoch {epoch}")
            break
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
