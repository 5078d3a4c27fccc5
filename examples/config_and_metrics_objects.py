"""Object collectives: rank 0 broadcasts the run configuration, every rank reports its
statistics with all_gather_object.

Rank 0 builds the configuration (as if read from a file or the command line) and shares
it with `broadcast_object_list`; each rank then trains on its part of the data and the
per-rank statistics (dicts of different sizes) are gathered with `all_gather_object`
so that rank 0 can print a summary. The script starts its own ranks with mp.spawn.

    python examples/config_and_metrics_objects.py
    simdist run examples/config_and_metrics_objects.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F


def worker(rank, world_size, lr):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29613")
    dist.init_process_group("gloo", rank=rank, world_size=world_size)

    config = [{"lr": lr, "steps": 3, "tags": ["baseline", "objects"]} if rank == 0 else None]
    dist.broadcast_object_list(config, src=0)
    cfg = config[0]

    torch.manual_seed(rank)
    model = torch.nn.Linear(3, 1)
    opt = torch.optim.SGD(model.parameters(), lr=cfg["lr"])
    losses = []
    for _ in range(cfg["steps"]):
        x = torch.randn(8, 3)
        loss = F.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses.append(round(loss.item(), 6))

    stats = {"rank": rank, "losses": losses, "host": f"node{rank // 2}"}
    gathered = [None] * world_size
    dist.all_gather_object(gathered, stats)
    if rank == 0:
        print(f"config {cfg}")
        for s in gathered:
            print(f"rank {s['rank']} on {s['host']}: final loss {s['losses'][-1]} after {len(s['losses'])} steps")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--world-size", type=int, default=3)
    p.add_argument("--lr", type=float, default=0.05)
    args = p.parse_args()
    mp.spawn(worker, args=(args.world_size, args.lr), nprocs=args.world_size)
