"""Rank 0 prepares data alone (CPU-bound, counted in its thread's CPU time, printing a line
after each chunk) while the others wait at a barrier of a group with a short timeout. They
time out long before rank 0's first line; torchrun's agent SIGTERMs rank 0 in its
computation, so none of its lines was printed (real Gloo, 3 ranks, `0.5 1.5 2`: timeout,
seconds a chunk, chunks). The simulator stamped a line at the rank's last message, before
the computation: the lines stood in its report.

    simdist compare tests/scripts/compute_past_agent.py --nproc-per-node 3 -- 0.5 1.5 2
"""

import sys
import time
from datetime import timedelta

import torch
import torch.distributed as dist


def chunk(seconds: float) -> None:
    t0 = time.thread_time()  # CPU time: the simulator's compute, and no shorter in wall time
    x = torch.zeros(1)
    while time.thread_time() - t0 < seconds:
        x += torch.randn(100, 100).sum()


def main():
    timeout, seconds, chunks = float(sys.argv[1]), float(sys.argv[2]), int(sys.argv[3])
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    dist.barrier()  # every rank is in; then rank 0 prepares
    if rank == 0:
        for i in range(chunks):
            chunk(seconds)
            print(f"rank 0 prepared chunk {i}", flush=True)
    dist.barrier()
    print(f"rank {rank} past the barrier", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
