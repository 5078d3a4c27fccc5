"""A validation loop that shards the evaluation set by hand (indices[rank::world], no
DistributedSampler) and all-reduces [correct, count] per batch for a running accuracy: 13
samples over 3 ranks are 5, 4, 4, so 3, 2, 2 batches of 2, and ranks 1 and 2 reach the
final all_reduce of their totals (3 floats) while rank 0 all-reduces its third batch's
(2 floats): on Gloo the mismatched all_reduce never completes (a hang). --gather collects
the predictions with all_gather_object instead and all-reduces the totals once: completes.

    torchrun --nproc-per-node 3 examples/eval_running_accuracy.py [--gather]
    simdist compare examples/eval_running_accuracy.py --nproc-per-node 3
"""

import argparse
import logging

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Subset, TensorDataset

log = logging.getLogger("eval")


def build_data(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 6, generator=g)
    y = (x.sum(dim=1) > 0).long()
    return TensorDataset(x, y)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--val-size", type=int, default=13)
    p.add_argument("--batch-size", type=int, default=2)
    p.add_argument("--gather", action="store_true")
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    log.info("evaluating %d samples on %d ranks", args.val_size, world)
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(6, 8), nn.Tanh(), nn.Linear(8, 2)))
    val = build_data(args.val_size)
    shard = Subset(val, list(range(args.val_size))[rank::world])
    loader = DataLoader(shard, batch_size=args.batch_size)
    model.eval()
    correct = torch.zeros(1)
    seen = torch.zeros(1)
    preds = []
    with torch.no_grad():
        for i, (x, y) in enumerate(loader):
            out = model(x)
            c = (out.argmax(1) == y).sum().float()
            correct += c
            seen += len(y)
            preds.extend(out.argmax(1).tolist())
            if not args.gather:
                running = torch.stack([c, torch.tensor(float(len(y)))])
                dist.all_reduce(running)
                if rank == 0:
                    print(f"batch {i} running acc {(running[0] / running[1]).item():.4f}", flush=True)
    if args.gather:
        everyone = [None] * world
        dist.all_gather_object(everyone, preds)
        print(f"[rank{rank}] gathered {sum(len(p) for p in everyone)} predictions", flush=True)
    totals = torch.cat([correct, seen, torch.tensor([float(rank)])])
    dist.all_reduce(totals)
    print(f"[rank{rank}] accuracy {(totals[0] / totals[1]).item():.4f} over {int(totals[1].item())}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
