"""A rank that waits outside any operation: after a barrier, the last rank blocks on a queue
its (dead) producer thread never fills, the others all-reduce. Nothing can progress and no
rank is in a Gloo timeout: the watchdog ends the run, and each rank's line is where its main
thread stands (the queue's get, the all_reduce), not its last operation. Any world size >= 2.
"""

import queue

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    dist.barrier()
    print(f"rank {rank}: past the barrier", flush=True)
    if rank == world - 1:
        batches = queue.Queue()
        batches.get()  # the producer died: waits forever
    t = torch.ones(2)
    dist.all_reduce(t)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
