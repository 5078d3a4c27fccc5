"""Rank 0's main thread waits CHILD s for a child process (subprocess.run) while a side thread
of it sleeps SIDE s (rank 1's SIDE / 2 s), then all-reduces on a side group; then the main thread joins a barrier of
the default group (timeout LIMIT s) that rank 1 entered at once. Real Gloo: rank 0 reaches the
barrier at max(CHILD, SIDE) s; with LIMIT past that, every rank completes. The simulator
added the child wait (told at its end) to the clock the side thread's post had moved on already:
rank 0 came CHILD + SIDE s late and rank 1's barrier timed out (`RankConn.child_wait`).

    torchrun --nproc-per-node 2 side_post_child_wait.py CHILD SIDE LIMIT
"""
import subprocess
import sys
import threading
import time
from datetime import timedelta

import torch
import torch.distributed as dist

child, side, limit = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo", timeout=timedelta(seconds=limit))
rank = dist.get_rank()
group = dist.new_group(timeout=timedelta(seconds=60))
dist.barrier()


def later():
    time.sleep(side if rank == 0 else side / 2)  # (rank 1's: its barrier is posted first, not in a race with it)
    t = torch.ones(1)
    dist.all_reduce(t, group=group)
    print(rank, "side all_reduce", t.item(), flush=True)


th = threading.Thread(target=later)
th.start()
if rank == 0:
    subprocess.run(["sleep", child], check=True)
try:
    dist.barrier()
    print(rank, "past the barrier", flush=True)
except RuntimeError as e:
    print(rank, "barrier raised", type(e).__name__, flush=True)
th.join()
dist.destroy_process_group()
