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
previous rank: each receive completes only after its sender's new_group returned; then a
barrier of the world, and all complete. The barrier keeps every rank from leaving before
all have returned from new_group: Gloo returns from it once a rank's OWN side of each pair
is connected, so without it the last rank, its message from rank 0 in, could exit while
rank 1 (descheduled on a loaded host) still connects its pair with it, and rank 1 then
fails in new_group ("Gloo connectFullMesh failed with ... Connection closed by peer") and
rank 0's receive from it with it: once in a CI run, 1 of 30 beside two CPU burners, 3 of
10 with rank 1 stopped while it connects (`bench/new_group_exit_probe.py exit`); with the
barrier 0 of 20 (`... barrier`). That race is `simdist.races.ConnectRace`'s, not this
script's subject.
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
    dist.barrier()  # nobody leaves while a member may still connect the group (docstring)
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
