"""Pairwise groups made with new_group(use_local_synchronization=True): each rank creates
only the pairs it belongs to, then all-reduces in each. Torch names such a group by a hash
of its ranks and of how many groups the rank already has, and Gloo's constructor waits for
every member under that name.

    --pairs disjoint  (0, 1), (2, 3), ...: each rank makes at most one: completes
    --pairs chain     (0, 1), (1, 2), ...: rank 1 makes (1, 2) as its second group, rank 2 as
                      its first, so they name it differently and both wait in new_group for
                      good (on real Gloo too); rank 0 waits in its all_reduce with rank 1
Any world size >= 3.
"""

import argparse

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--pairs", choices=["disjoint", "chain"], default="disjoint")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    step = 2 if args.pairs == "disjoint" else 1
    mine = [(p, p + 1) for p in range(0, world - 1, step) if rank in (p, p + 1)]
    groups = {pr: dist.new_group(list(pr), use_local_synchronization=True) for pr in mine}
    print(f"rank {rank}: made {len(groups)} groups", flush=True)
    for pr in sorted(groups):
        t = torch.tensor([float(rank + 1)])
        dist.all_reduce(t, group=groups[pr])
        print(f"rank {rank}: pair {pr} sum {t.item()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
