# Join tutorial: a custom Joinable (Counter)
# From the PyTorch tutorial "Distributed Training with Uneven Inputs Using the Join Context
# Manager": the tutorial's code blocks, verbatim and in order. Run it as it is (python examples/join_tutorial_counter.py).

import os
import torch
import torch.distributed as dist
import torch.multiprocessing as mp
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP

BACKEND = "nccl"
WORLD_SIZE = 2
NUM_INPUTS = 5

from torch.distributed.algorithms.join import Joinable, JoinHook

class CounterJoinHook(JoinHook):
    def __init__(self, counter, sync_max_count):
        self.counter = counter
        self.sync_max_count = sync_max_count
    
    def main_hook(self):
        """Shadow the counter's all-reduce by all-reducing a zero tensor."""
        t = torch.zeros(1, device=self.counter.device)
        dist.all_reduce(t)
    
    def post_hook(self, is_last_joiner: bool):
        """Synchronize max count across all counters if sync_max_count=True."""
        if not self.sync_max_count:
            return
        rank = dist.get_rank(self.counter.process_group)
        common_rank = self.counter.find_common_rank(rank, is_last_joiner)
        if rank == common_rank:
            self.counter.max_count = self.counter.count.detach().clone()
        dist.broadcast(self.counter.max_count, src=common_rank)

class Counter(Joinable):
    def __init__(self, device, process_group):
        super(Counter, self).__init__()
        self.device = device
        self.process_group = process_group
        self.count = torch.tensor([0], device=device).float()
        self.max_count = torch.tensor([0], device=device).float()
    
    def __call__(self):
        """Count inputs processed across all ranks."""
        Join.notify_join_context(self)
        t = torch.ones(1, device=self.device).float()
        dist.all_reduce(t)
        self.count += t
    
    def join_hook(self, **kwargs) -> JoinHook:
        sync_max_count = kwargs.get("sync_max_count", False)
        return CounterJoinHook(self, sync_max_count)
    
    @property
    def join_device(self) -> torch.device:
        return self.device
    
    @property
    def join_process_group(self):
        return self.process_group
    
    def find_common_rank(self, rank, to_consider):
        """Find max rank among those to consider."""
        common_rank = torch.tensor([rank if to_consider else -1], device=self.device)
        dist.all_reduce(common_rank, op=dist.ReduceOp.MAX, group=self.process_group)
        return common_rank.item()

def worker(rank):
    assert torch.cuda.device_count() >= WORLD_SIZE
    os.environ['MASTER_ADDR'] = 'localhost'
    os.environ['MASTER_PORT'] = '29500'
    dist.init_process_group(BACKEND, rank=rank, world_size=WORLD_SIZE)
    
    counter = Counter(torch.device(f"cuda:{rank}"), dist.group.WORLD)
    inputs = [torch.tensor([1]).float() for _ in range(NUM_INPUTS + rank)]
    
    with Join([counter], sync_max_count=True):
        for _ in inputs:
            counter()
    
    print(f"{int(counter.count.item())} inputs processed before rank {rank} joined!")
    print(f"{int(counter.max_count.item())} inputs processed across all ranks!")

def main():
    mp.spawn(worker, nprocs=WORLD_SIZE, join=True)

if __name__ == "__main__":
    main()
