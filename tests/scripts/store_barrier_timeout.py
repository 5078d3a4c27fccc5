"""With TORCH_DIST_INIT_BARRIER=1, `new_group([0, 1], timeout=T)` ends with torch's store-based
barrier over the whole world (`c10d._store_based_barrier`), which the last rank never enters:
ranks 0 and 1 raise `DistStoreError: Timed out initializing process group in store based
barrier ...` at the first multiple of its wait interval (10 s + world/1000 s) past T.

    python store_barrier_timeout.py T [exits|waits]   # torchrun-style, 3 ranks or more

`exits`: the last rank exits after init; `waits`: it waits in a barrier of the world, which
fails once ranks 0 and 1 raised and left.
"""
import datetime
import sys

import torch.distributed as dist

dist.init_process_group("gloo")
rank, last = dist.get_rank(), dist.get_world_size() - 1
limit, mode = float(sys.argv[1]), sys.argv[2] if len(sys.argv) > 2 else "exits"
if rank == last:
    print(rank, "never made the group", flush=True)
    if mode == "exits":
        sys.exit(0)
    dist.barrier()
elif rank in (0, 1):
    dist.new_group([0, 1], timeout=datetime.timedelta(seconds=limit))
    print(rank, "made the group", flush=True)
dist.destroy_process_group()
