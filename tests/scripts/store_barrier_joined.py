"""TORCH_DIST_INIT_BARRIER=1: torch's store-based barrier error counts the ranks that had
entered the barrier when the raising rank's turn ended (`num_workers_joined`), whenever
the others were heard of. 3 ranks or more, torchrun-style:

    python store_barrier_joined.py

Rank 0 makes `new_group([0], timeout=1 s)` at once: it waits in the barrier over the world
and raises at its first turn (10 s + world/1000 s). Rank 1 first receives from the last
rank, which never sends: the world's 10.5 s timeout ends it, and rank 1 then enters the
barrier, after rank 0 raised. The other ranks sleep 11 s, then enter: the count is whole,
and ranks 1.. make the group. Rank 0's error says `num_workers_joined=1`.
"""
import datetime
import re
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=10.5))
rank, world = dist.get_rank(), dist.get_world_size()
if rank == 1:
    try:
        dist.recv(torch.zeros(1), src=world - 1)
    except RuntimeError as e:
        print(rank, "recv raised", type(e).__name__, flush=True)
elif rank > 1:
    time.sleep(1.0)  # (two sleeps: the second one's message comes once rank 0 waits in the barrier)
    time.sleep(10.0)
try:
    dist.new_group([0], timeout=datetime.timedelta(seconds=1))
    print(rank, "made the group", flush=True)
except RuntimeError as e:
    print(rank, type(e).__name__, re.search(r"num_workers_joined=\d+", str(e)).group(0), flush=True)
dist.destroy_process_group()
