"""With TORCH_DIST_INIT_BARRIER=1, `new_group([0, 1], timeout=T)` ends with torch's store-based
barrier over the whole world (`c10d._store_based_barrier`), which the last rank never enters:
ranks 0 and 1 raise `DistStoreError: Timed out initializing process group in store based
barrier ...` at the first multiple of its wait interval (10 s + world/1000 s) past T.

    python store_barrier_timeout.py T [exits|waits]   # torchrun-style, 3 ranks or more

`exits`: the last rank exits after init; `waits`: it waits in a barrier of the world, which
fails once ranks 0 and 1 raised and left; `recv`: the world's timeout is 2 s and the last
rank first receives from rank 0, which never sends: its recv times out at 2 s, it goes on to
the group's creation and makes the barrier's count whole, so everyone makes the group.
"""
import datetime
import sys

import torch
import torch.distributed as dist

limit, mode = float(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "exits"
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2) if mode == "recv" else None)
rank, last = dist.get_rank(), dist.get_world_size() - 1
if mode == "recv" and rank == last:
    try:
        dist.recv(torch.zeros(1), src=0)
    except RuntimeError as e:
        print(rank, "recv:", type(e).__name__, flush=True)
if rank == last and mode != "recv":
    print(rank, "never made the group", flush=True)
    if mode == "exits":
        sys.exit(0)
    dist.barrier()
elif rank in (0, 1) or mode == "recv":
    dist.new_group([0, 1], timeout=datetime.timedelta(seconds=limit))
    print(rank, "made the group", flush=True)
dist.destroy_process_group()
