"""Generations of ranks in one process (torchrun-style): init, work, destroy, init again.

--case overlap: rank 0 initialises the second generation while rank 1 still computes in the
  first (0.5 s); rank 0's first all_reduce of generation 2 waits for rank 1 to join it.
--case shrink: 3 ranks, then a second generation of 2 (rank 2 leaves after the first).
--case hang: in generation 2 rank 1 receives what rank 0 never sends, while rank 0 waits
  in an all_reduce: a hang in the second generation.
"""
import argparse
import os
import time

import torch
import torch.distributed as dist

p = argparse.ArgumentParser()
p.add_argument("--case", choices=["overlap", "shrink", "hang"], required=True)
case = p.parse_args().case

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.ones(2) * (rank + 1)
dist.all_reduce(t)
print(f"gen1 [{rank}/{world}] {t.tolist()}", flush=True)
if case == "overlap" and rank == 1:
    time.sleep(0.5)  # still in generation 1 while rank 0 starts generation 2
dist.destroy_process_group()

if case == "shrink" and rank == 2:
    print("gen1 [2] leaves", flush=True)
else:
    size = 2 if case == "shrink" else world
    dist.init_process_group("gloo", rank=int(os.environ["RANK"]), world_size=size)
    t = torch.arange(3.0) + 10 * rank
    dist.all_reduce(t)
    print(f"gen2 [{rank}/{dist.get_world_size()}] {t.tolist()}", flush=True)
    if case == "hang":
        if rank == 1:
            dist.recv(torch.zeros(1), src=0)
        else:
            dist.all_reduce(t)
    dist.barrier()
    dist.destroy_process_group()
