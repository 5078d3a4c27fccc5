"""DDP with ZeroRedundancyOptimizer at world size 4 with uneven data: 3, 5, 5 and 8 batches.

Each rank reads its own shard, and the shards differ in length (`--shard-batches`). The
loop runs under `Join([model, optimizer])`: a rank that runs out of batches keeps
shadowing DDP's gradient all-reduces and ZeRO's parameter broadcasts until every rank is
done. With `--throw-on-early-termination`, DDP's join instead makes every rank raise as
soon as the first one runs out, which is what a script wants when uneven inputs are a bug.

    torchrun --nproc-per-node 4 examples/ddp_zero_uneven.py
    torchrun --nproc-per-node 4 examples/ddp_zero_uneven.py --throw-on-early-termination
    simdist run examples/ddp_zero_uneven.py --nproc-per-node 4 -- --throw-on-early-termination
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.distributed.optim import ZeroRedundancyOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--shard-batches", default="3,5,5,8", help="batches per rank, comma-separated")
    p.add_argument("--throw-on-early-termination", action="store_true")
    p.add_argument("--lr", type=float, default=0.01)
    return p.parse_args()


def main():
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")
    counts = [int(n) for n in args.shard_batches.split(",")]
    if len(counts) != world:
        raise SystemExit(f"--shard-batches needs {world} counts, got {len(counts)}")

    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(6, 10), torch.nn.GELU(), torch.nn.Linear(10, 3)).to(device))
    optimizer = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=args.lr)
    g = torch.Generator().manual_seed(rank)
    shard = [(torch.randn(4, 6, generator=g), torch.randint(0, 3, (4,), generator=g)) for _ in range(counts[rank])]

    done = 0
    with Join([model, optimizer], throw_on_early_termination=args.throw_on_early_termination):
        for x, y in shard:
            loss = F.cross_entropy(model(x.to(device)), y.to(device))
            optimizer.zero_grad()
            loss.backward()
            optimizer.step()
            done += 1
            if done % 2 == 0:
                print(f"rank {rank} batch {done}: loss {loss.item():.6f}")
    checksum = sum(p.detach().sum().item() for p in model.parameters())
    print(f"rank {rank}: {done}/{len(shard)} batches, last loss {loss.item():.6f}, parameter checksum {checksum:.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
