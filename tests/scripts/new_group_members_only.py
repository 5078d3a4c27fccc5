"""`new_group([0, 1])` (without `use_local_synchronization`) waits for its members only: on
torch 2.13's Gloo (no `TORCH_DIST_INIT_BARRIER`) a rank outside the group returns from
`new_group` at once and need not call it at all, so here the last rank sleeps and never
calls it while ranks 0 and 1 create the group and all-reduce on it.

    python new_group_members_only.py [first]   # torchrun-style, 3 ranks or more

`first`: every rank joins a barrier of the world before (a collective before new_group).
"""
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, last = dist.get_rank(), dist.get_world_size() - 1
if sys.argv[1:] == ["first"]:
    dist.barrier()
if rank == last:
    time.sleep(1.0)
    print(rank, "never made the group", flush=True)
else:
    side = dist.new_group([0, 1])
    t = torch.ones(1)
    if rank in (0, 1):
        dist.all_reduce(t, group=side)
    print(rank, "side", t.item(), flush=True)
dist.barrier()
dist.destroy_process_group()
