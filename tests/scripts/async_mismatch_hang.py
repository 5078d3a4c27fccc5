"""Two async all_reduces issued in opposite orders with different sizes, then waited: rank 1
issues 5 then 2 elements, the others 2 then 5. Gloo pairs each rank's first (and second)
all_reduce: in a world of 4 no message is longer than its receive (no abort, as in a world
of 2), the ring never completes, and every wait hangs on both sides. `how` chooses how the
handles are waited: `reverse` (second handle first), or `collect` (torch.futures.collect_all
of their futures). A second argument, in seconds: first an all_reduce on a group with that
timeout, which completes (a finished group's timeout bounds no wait)."""

import datetime
import sys

import torch
import torch.distributed as dist
import torch.futures

how = sys.argv[1] if len(sys.argv) > 1 else "reverse"
dist.init_process_group("gloo")
if len(sys.argv) > 2:
    dist.all_reduce(torch.ones(1), group=dist.new_group(timeout=datetime.timedelta(seconds=float(sys.argv[2]))))
rank = dist.get_rank()
sizes = (5, 2) if rank == 1 else (2, 5)
works = [dist.all_reduce(torch.ones(n), async_op=True) for n in sizes]
if how == "collect":
    torch.futures.collect_all([w.get_future() for w in works]).wait()
else:
    for w in reversed(works):
        w.wait()
print(rank, "done")
dist.destroy_process_group()
