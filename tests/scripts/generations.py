"""Generations of ranks in one process (torchrun-style): init, work, destroy, init again.

--case overlap: rank 0 initialises the second generation while rank 1 still computes in the
  first (0.5 s); rank 0's first all_reduce of generation 2 waits for rank 1 to join it.
--case shrink: 3 ranks, then a second generation of 2 (rank 2 leaves after the first).
--case grow: 3 processes; a first generation of 2 (rank 2's process waits, outside torch, for
  the file --sync that rank 0 writes after it), then all 3 in a second generation.
--case hang: in generation 2 rank 1 receives what rank 0 never sends, while rank 0 waits
  in an all_reduce: a hang in the second generation.
--case leave: in generation 2 rank 1 sleeps 1.5 s and exits while rank 0 waits in an
  all_reduce (stalled, by its own account): rank 0 fails when rank 1's process is gone.
--case linger: 3 ranks; ranks 0 and 1 each receive from the other (a hang) while rank 2 has
  destroyed its group and sleeps 1 s, prints and exits: it is no part of the hang.
--case refused: rank 0 makes a second generation of 1; rank 1 initialises again as rank 5
  of 2, which simdist refuses (the rank raises; the refusal is its error, on both sides).
--case twice: every rank initialises again without destroying: torch's own ValueError.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--case", choices=["overlap", "shrink", "grow", "hang", "leave", "linger", "twice", "refused"], required=True)
p.add_argument("--sync", default="")
a = p.parse_args()
case = a.case

if case == "grow" and os.environ["RANK"] == "2":
    while not os.path.exists(a.sync):
        time.sleep(0.05)
    os.remove(a.sync)
    print("gen1 [2] waited", flush=True)
else:
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]),
                            world_size=2 if case == "grow" else int(os.environ["WORLD_SIZE"]))
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.ones(2) * (rank + 1)
    dist.all_reduce(t)
    print(f"gen1 [{rank}/{world}] {t.tolist()}", flush=True)
    if case == "overlap" and rank == 1:
        time.sleep(0.5)  # still in generation 1 while rank 0 starts generation 2
    if case == "twice":
        dist.init_process_group("gloo")
    if case == "linger" and rank < 2:
        dist.recv(torch.zeros(1), src=1 - rank)
    dist.destroy_process_group()
    if case == "grow" and rank == 0:
        open(a.sync, "w").close()

if case == "shrink" and int(os.environ["RANK"]) == 2:
    print("gen1 [2] leaves", flush=True)
elif case == "refused":  # rank 1 initialises again as a rank out of range: simdist refuses it
    r = int(os.environ["RANK"])
    dist.init_process_group("gloo", rank=5 if r == 1 else r, world_size=1 if r == 0 else 2)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"gen2 [{dist.get_rank()}/{dist.get_world_size()}] alone", flush=True)
    dist.destroy_process_group()
elif case == "linger":
    time.sleep(1.0)
    print("gen1 [2] bye", flush=True)
else:
    size = 2 if case == "shrink" else int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=size)
    rank = dist.get_rank()
    t = torch.arange(3.0) + 10 * rank
    dist.all_reduce(t)
    print(f"gen2 [{rank}/{dist.get_world_size()}] {t.tolist()}", flush=True)
    if case == "hang":
        if rank == 1:
            dist.recv(torch.zeros(1), src=0)
        else:
            dist.all_reduce(t)
    if case == "leave":
        if rank == 1:
            time.sleep(1.5)
            os._exit(0)  # its Gloo pairs close with the process, as the coordinator sees it end
        dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()
