"""Two generations of ranks in the same processes: initialise, work, destroy, initialise again.

A torchrun-style script that syncs a configuration with its peers in a first process group,
destroys it, and initialises the default group again for the real work (as a script that
restarts its communication after a phase change or a recovery does). Destroying the default
group resets torch's group names and sequence numbers: the second group's collectives are a
new generation (docs/script-backend.md), and so is its subgroup.

`--leave-early R`: in the second generation, rank R leaves before the last all_reduce, and
its peers meet an exited peer there.

    torchrun --nproc-per-node 3 examples/reinit_same_process.py
    simdist compare examples/reinit_same_process.py --nproc-per-node 3
"""

import argparse

import torch
import torch.distributed as dist


def phase_one():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    seed = torch.tensor([1234 if rank == 0 else 0])
    dist.broadcast(seed, src=0)
    counts = torch.tensor([float(rank + 1)])
    dist.all_reduce(counts)
    print(f"[{rank}] phase 1: seed {seed.item()}, {counts.item():g} items on {world} ranks")
    dist.destroy_process_group()
    return int(seed.item())


def phase_two(seed, leave_early):
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(seed + rank)
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    x = torch.randn(4)
    dist.all_reduce(x)
    if rank % 2 == 0:
        y = torch.ones(2) * rank
        dist.all_reduce(y, group=evens)
        print(f"[{rank}] phase 2: evens {y.tolist()}")
    if rank == leave_early:
        print(f"[{rank}] phase 2: leaving early")
        return
    dist.all_reduce(x, op=dist.ReduceOp.MAX)
    print(f"[{rank}] phase 2: {[round(v, 4) for v in x.tolist()]}")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--leave-early", type=int, default=None)
    args = p.parse_args()
    phase_two(phase_one(), args.leave_early)
