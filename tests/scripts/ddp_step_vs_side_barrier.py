"""An uneven-input hang that real Gloo keeps (no rank exits): rank 1 runs one DDP step fewer
and then waits in a barrier on a side group, while rank 0's extra backward waits in C++ for
DDP's gradient all-reduce (the reducer's wait, no Python frame of its own)."""
import torch
import torch.distributed as dist
from torch.nn.parallel import DistributedDataParallel as DDP

dist.init_process_group("gloo")
rank = dist.get_rank()
side = dist.new_group([0, 1])
model = DDP(torch.nn.Linear(4, 4))
for step in range(3 - rank):
    model(torch.ones(2, 4)).sum().backward()
    print(rank, "step", step, flush=True)
dist.barrier(group=side)
print(rank, "done", flush=True)
dist.destroy_process_group()
