"""Groups made with new_group(ranks, sort_ranks=False): torch keeps the given order, so group
rank i is ranks[i]. Each rank prints what depends on that order: its group rank, the group's
global ranks, an all_gather, a broadcast and a scatter rooted at group ranks (`group_src`), a
gather to group rank 0 (`group_dst`), a send/recv between group ranks 0 and 1.

    (no argument)  the whole world, reversed
    pair           [world - 1, 0] (ranks in between are not members)
    timeout T      [world - 1, 0] with timeout=T s; rank 0 exits first: the last rank
                   raises the store's error naming the member it waits for by group rank
    late           [world - 1, 0]; rank 0 computes 1.5 s first: the last rank waits for it (a
                   sleep is a timed wait the simulator ends at once once the others wait,
                   `rank.timedwait`: no wall time passes, no status line is due)
    ops            [1, 0, 2, ...]: the ring's order differs from the ascending one: group
                   rank 0 all-reduces with MAX, the others with SUM (Gloo pairs them; each
                   segment is reduced by its owner's op, the owner a group rank)
    sizes          [1, 0, 2, ...]: group rank 0 all-reduces 8 elements, the others 6: which
                   rank aborts on the longer message follows the ring of group ranks
                   (ops, sizes: a barrier of the world after new_group; without it a rank
                   still connecting the group (Gloo's connectFullMesh) could meet the abort
                   there, the group-connection race `simdist.races.ConnectRace`: 1 of 20
                   test runs beside two CPU hogs, 2026-11-24)
    orders T       each rank passes the world with itself first, timeout=T s: each registers
                   as group rank 0, nobody as 1, and every rank raises the store's wait
                   timeout for group rank 1
Any world size >= 2 (ops, sizes: >= 3).
"""

import sys
import time

import torch
import torch.distributed as dist


def main():
    mode = sys.argv[1] if len(sys.argv) > 1 else "world"
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    ranks = list(reversed(range(world))) if mode == "world" else [world - 1, 0]
    if mode == "orders":
        dist.new_group([rank, *(r for r in range(world) if r != rank)], sort_ranks=False,
                       timeout=__import__("datetime").timedelta(seconds=float(sys.argv[2])))
        return
    if mode in ("ops", "sizes"):
        ranks = [1, 0, *range(2, world)]
        g = dist.new_group(ranks, sort_ranks=False)
        dist.barrier()  # no member uses g before every member has connected it (the docstring)
        first = dist.get_rank(g) == 0
        t = torch.arange(8 if first and mode == "sizes" else 6, dtype=torch.float32) * (rank + 1)
        dist.all_reduce(t, op=dist.ReduceOp.MAX if first and mode == "ops" else dist.ReduceOp.SUM, group=g)
        print(f"rank {rank}: {t.tolist()}", flush=True)
        dist.destroy_process_group()
        return
    if mode == "late" and rank == 0:
        began = time.perf_counter()
        while time.perf_counter() - began < 1.5:
            pass
    if mode == "timeout":
        dist.barrier()
        if rank == 0:
            sys.exit(0)
        if rank in ranks:
            dist.new_group(ranks, timeout=__import__("datetime").timedelta(seconds=float(sys.argv[2])),
                           sort_ranks=False)
        return
    g = dist.new_group(ranks, sort_ranks=False)
    if rank in ranks:
        me, n = dist.get_rank(g), len(ranks)
        members = [dist.get_global_rank(g, i) for i in range(n)]
        got = [torch.zeros(1) for _ in range(n)]
        dist.all_gather(got, torch.tensor([float(rank)]), group=g)
        b = torch.tensor([float(rank)])
        dist.broadcast(b, group=g, group_src=0)
        s = torch.zeros(1)
        dist.scatter(s, [torch.tensor([10.0 + i]) for i in range(n)] if me == 1 else None, group=g, group_src=1)
        gathered = [torch.zeros(1) for _ in range(n)] if me == 0 else None
        dist.gather(torch.tensor([float(rank)]), gathered, group=g, group_dst=0)
        p = torch.tensor([float(rank)])
        if me == 0:
            dist.send(p, group=g, group_dst=1)
        elif me == 1:
            dist.recv(p, group=g, group_src=0)
        print(f"rank {rank}: group rank {me} of {members}; all_gather {[t.item() for t in got]}; "
              f"broadcast {b.item()}; scatter {s.item()}; "
              f"gather {[t.item() for t in gathered] if gathered else None}; p2p {p.item()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
