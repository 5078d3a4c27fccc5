# Join tutorial: DistributedDataParallel alone
# From the PyTorch tutorial "Distributed Training with Uneven Inputs Using the Join Context
# Manager": the tutorial's code blocks, verbatim and in order. Run it as it is (python examples/join_tutorial_ddp.py).

import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

BACKEND = "nccl"
WORLD_SIZE = 2
NUM_INPUTS = 5

def worker(rank):
    # Initialize process group
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '29500'
    dist.init_process_group(BACKEND, rank=rank, world_size=WORLD_SIZE)
    
    # Create model with DDP
    model = DDP(torch.nn.Linear(1, 1).to(rank), device_ids=[rank])
    
    # Create uneven inputs: rank 1 gets one more input than rank 0
    inputs = [torch.tensor([1]).float() for _ in range(NUM_INPUTS + rank)]
    
    num_inputs = 0
    for input in inputs:
        num_inputs += 1
        loss = model(input).sum()
        loss.backward()
    
    print(f"Rank {rank} has exhausted all {num_inputs} of its inputs!")

def main():
    mp.spawn(worker, nprocs=WORLD_SIZE, join=True)

if __name__ == "__main__":
    main()
