"""A rank's main thread waits in `new_group` while a side thread of the same rank runs a
collective or waits in a receive: neither hides the main thread's wait, nor outlives it.

    python new_group_side_thread.py [MODE]   # torchrun-style, 2 ranks or more

`exits` (default): every rank but the last calls `new_group(all ranks, timeout=1 s)` at once,
while a side thread sleeps 0.5 s and all-reduces on the world; the last rank all-reduces with
them (after the same sleep) and exits without making the group. On real Gloo (torch 2.13)
each waiting rank raises the store's `DistStoreError: wait timeout after 1000ms` (its key
names the last rank) and the last one completes.
`exchange`: each rank's side thread sleeps 0.3 s and receives from the next rank; its main
thread makes `new_group(all ranks)` (the last rank 0.6 s late), then sends its rank to the
previous rank: the receives complete only after every new_group returned; all complete.
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


def receive(got: torch.Tensor, src: int):
    time.sleep(0.3)
    dist.recv(got, src)


dist.init_process_group("gloo")
rank, last = dist.get_rank(), dist.get_world_size() - 1
if sys.argv[1:] == ["exchange"]:
    got = torch.zeros(1)
    thread = threading.Thread(target=receive, args=(got, (rank + 1) % (last + 1)))
    thread.start()
    if rank == last:
        time.sleep(0.6)
    dist.new_group(list(range(last + 1)))
    dist.send(torch.tensor([float(rank)]), (rank - 1) % (last + 1))
    thread.join()
    print(rank, "received", got.item(), flush=True)
    sys.exit(0)
if rank == last:
    side()
    sys.exit(0)
thread = threading.Thread(target=side)
thread.start()
try:
    dist.new_group(list(range(last + 1)), timeout=datetime.timedelta(seconds=1))
finally:
    thread.join()
