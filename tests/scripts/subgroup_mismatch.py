"""A message longer than its receive on a group in the given order [1, 0, 2, ...]
(`new_group(sort_ranks=False)`): global rank 1 is group rank 0. 3 ranks or more,
torchrun-style:

    python subgroup_mismatch.py bc|p2p

`bc`: rank 1 broadcasts 2 floats to the group, the others expect 1: they abort (SIGABRT,
Gloo's I/O thread throws). `p2p`: rank 1 sends 2 floats to rank 2, which receives 1 and
aborts. What each aborting process prints (`what():`) is Gloo's words.
"""
import sys

import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
g = dist.new_group([1, 0] + list(range(2, world)), sort_ranks=False)
if mode == "bc":
    dist.broadcast(torch.ones(2 if rank == 1 else 1), src=1, group=g)
elif rank == 1:
    dist.send(torch.ones(2), dst=2, group=g)
elif rank == 2:
    dist.recv(torch.ones(1), src=1, group=g)
print(rank, "done", flush=True)
dist.destroy_process_group()
