"""Finding the straggler: after loading its data shard each rank enters
dist.monitored_barrier(wait_all_ranks=True), so rank 0 names every rank that did not make
it in time. Here the last rank's shard is missing and it raises (under @record, as a
torchrun entry point); rank 0's message names it, the others learn rank 0 is gone.

    torchrun --nproc-per-node 3 examples/monitored_barrier_straggler.py
    simdist compare examples/monitored_barrier_straggler.py --nproc-per-node 3
"""

import datetime
import os

import torch
import torch.distributed as dist
from torch.distributed.elastic.multiprocessing.errors import record


def load_shard(rank, world):
    if rank == world - 1:
        raise FileNotFoundError(f"shard-{rank:05d}.pt")
    return torch.full((4,), float(rank))


@record
def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    shard = load_shard(rank, world)
    print(f"rank {rank}: shard loaded, local rank {os.environ['LOCAL_RANK']}", flush=True)
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=5), wait_all_ranks=True)
    dist.all_reduce(shard)
    print(f"rank {rank}: {shard.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
