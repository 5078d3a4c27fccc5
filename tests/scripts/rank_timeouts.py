"""Gloo's timeout is each process's own: every rank gives init_process_group its own
timeout (2 s + 1 s per rank), then rank 0 all-gathers while the others wait in a barrier.
Rank 0's 2 s end its wait first; it raises and exits, and the others' waits fail with the
peer gone before their own (longer) timeouts come (found by bench/script_sweep.py: the
simulator gave every rank of the group the timeout of whichever rank made it last)."""

import datetime
import os

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2 + rank))
    world = dist.get_world_size()
    dist.barrier()
    print(f"[{rank}] started", flush=True)
    if rank == 0:
        out = [torch.zeros(3) for _ in range(world)]
        dist.all_gather(out, torch.ones(3))
    else:
        dist.barrier()
    print(f"[{rank}] never printed", flush=True)


if __name__ == "__main__":
    main()
