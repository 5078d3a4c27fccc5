"""A member of a new group never calls `new_group`: on real Gloo the members that do wait in
its creation (Gloo's full-mesh connect, at the c10d store) for the missing member's address,
until the group's timeout (torch's default: 30 min), while the missing member does something
else. The shape of a rank that waits in `new_group` for a peer that failed its init.

    python new_group_member_skips.py MODE [TIMEOUT_S]   # torchrun-style, 2 ranks or more

MODE: what the last rank does instead of `new_group(all ranks)`: `barrier` (a barrier of the
world, which its peers never reach: every rank waits for good), `exits` (every rank first
joins a barrier of the world, then the last one exits normally: a collective before new_group,
and on real Gloo no rank leaves while a peer's init still connects to it),
`sleeps<S>` (it sleeps S seconds, then calls `new_group` too: the group is made, every rank
all-reduces on it). TIMEOUT_S: the group's `timeout=` (default: none, torch's 30 min). `--catch`: a rank whose
new_group raises prints what it raised and exits 0 (no process fails, so torchrun's agent never
acts and the late member's own new_group shows: tests/test_script_catch_chains.py).
"""
import datetime
import sys
import time

import torch
import torch.distributed as dist

argv, catch = [a for a in sys.argv if a != "--catch"], "--catch" in sys.argv
mode = argv[1]
kw = {"timeout": datetime.timedelta(seconds=float(argv[2]))} if len(argv) > 2 else {}
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
if mode == "exits":
    dist.barrier()
t = torch.ones(1)
if rank == world - 1 and mode == "barrier":
    dist.barrier()
elif rank == world - 1 and mode == "exits":
    sys.exit(0)
else:
    if rank == world - 1:
        time.sleep(float(mode.removeprefix("sleeps")))
    try:
        everyone = dist.new_group(list(range(world)), **kw)
    except Exception as e:
        if not catch:
            raise
        print(rank, "new_group raised", type(e).__name__, "(store timeout)" if "wait timeout" in str(e) else
              "(connectFullMesh)" if "connectFullMesh failed" in str(e) else str(e).splitlines()[0], flush=True)
        sys.exit(0)
    dist.all_reduce(t, group=everyone)
print(rank, "done", t.item(), flush=True)
dist.destroy_process_group()
