"""Two generations of ranks: train with one `mp.spawn`, evaluate with a second one.

The first spawn trains a small model with DDP on 2 ranks, and rank 0 saves its weights;
the second spawn starts 3 new processes (a different world size) that load the weights,
evaluate on their shards and all-reduce the loss. Each spawn's ranks initialise the default
process group and destroy it, as the "Getting Started with DDP" tutorial's `demo_basic` and
`demo_checkpoint` do: two lives of the default group, "generations" (docs/script-backend.md).

`--skip-eval-on R`: rank R of the evaluation returns before the loss all_reduce (its
"shard is empty"), so the others meet an exited peer in generation 2.

    python examples/two_spawns_train_then_evaluate.py
    simdist compare examples/two_spawns_train_then_evaluate.py
"""

import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def setup(rank, world_size, port):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)


def train(rank, world_size, path, steps):
    setup(rank, world_size, 29621)
    torch.manual_seed(0)  # the same initial weights on every rank
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    torch.manual_seed(1 + rank)  # each rank its own data
    for step in range(steps):
        x = torch.randn(8, 4)
        loss = F.mse_loss(model(x), x.sum(dim=1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        print(f"train rank {rank} step {step}: loss {loss.item():.6f}")
    if rank == 0:
        torch.save(model.module.state_dict(), path)
    dist.barrier()  # the others leave only once the weights are saved
    dist.destroy_process_group()


def evaluate(rank, world_size, path, skip):
    setup(rank, world_size, 29622)
    model = torch.nn.Linear(4, 1)
    model.load_state_dict(torch.load(path))
    torch.manual_seed(100 + rank)
    x = torch.randn(16, 4)
    if rank == skip:
        print(f"eval rank {rank}: empty shard, leaving")
        return
    with torch.no_grad():
        loss = F.mse_loss(model(x), x.sum(dim=1, keepdim=True)).reshape(1)
    dist.all_reduce(loss)
    print(f"eval rank {rank}: mean loss {loss.item() / world_size:.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--train-ranks", type=int, default=2)
    p.add_argument("--eval-ranks", type=int, default=3)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--skip-eval-on", type=int, default=None)
    args = p.parse_args()
    with tempfile.TemporaryDirectory() as tmp:
        weights = os.path.join(tmp, "weights.pt")
        mp.spawn(train, args=(args.train_ranks, weights, args.steps), nprocs=args.train_ranks)
        mp.spawn(evaluate, args=(args.eval_ranks, weights, args.skip_eval_on), nprocs=args.eval_ranks)
