"""A rank's main thread waits in `new_group(timeout=)` while a side thread of the same rank
runs a collective: the side thread's operation must not hide the main thread's wait.

    python new_group_side_thread.py   # torchrun-style, 2 ranks or more

Every rank but the last calls `new_group(all ranks, timeout=1 s)` at once, while a side
thread sleeps 0.5 s and all-reduces on the world; the last rank all-reduces with them (after
the same sleep) and exits without making the group. On real Gloo (torch 2.13) each waiting
rank raises the store's `DistStoreError: wait timeout after 1000ms` (its key names the last
rank) and the last one completes.
"""
import datetime
import sys
import threading
import time

import torch
import torch.distributed as dist


def side():
    time.sleep(0.5)
    dist.all_reduce(torch.ones(1))


dist.init_process_group("gloo")
rank, last = dist.get_rank(), dist.get_world_size() - 1
if rank == last:
    side()
    sys.exit(0)
thread = threading.Thread(target=side)
thread.start()
try:
    dist.new_group(list(range(last + 1)), timeout=datetime.timedelta(seconds=1))
finally:
    thread.join()
