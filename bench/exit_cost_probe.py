"""How long a rank takes from its script's last line to its exit (`agent.EXIT_MIN_S`/`EXIT_MAX_S`):
rank 1 broadcasts on a group in the order [1, 0, 2, ...] and times `destroy_process_group`.

    torchrun --standalone --nproc-per-node 3 bench/exit_cost_probe.py abort|live|nodestroy

`abort`: the others expect 1 float where rank 1 sends 2 and abort (SIGABRT), so rank 1 destroys
its group with aborted peers (`tests/scripts/subgroup_mismatch.py bc`); `live`: every rank
sends 2 and destroys with live peers; `nodestroy`: no destroy. Each rank prints
"<rank> <mode> destroy_s <seconds>"; torchrun's ChildFailedError table shows how rank 1's process
ended (0, -15: the agent's SIGTERM in its exit, -6: aborted in its teardown).
docs/script-backend.md, "torchrun's agent".
"""
import sys
import time

import torch
import torch.distributed as dist

mode = sys.argv[1]
dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
g = dist.new_group([1, 0] + list(range(2, world)), sort_ranks=False)
dist.broadcast(torch.ones(2 if rank == 1 or mode != "abort" else 1), src=1, group=g)
t0 = time.monotonic()
if mode != "nodestroy":
    dist.destroy_process_group()
print(rank, mode, "destroy_s", round(time.monotonic() - t0, 4), flush=True)
