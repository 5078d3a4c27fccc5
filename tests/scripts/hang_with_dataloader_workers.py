"""A hang with a DataLoader's worker processes alive: rank 0 waits in a recv nobody sends,
rank 1 in a barrier. The main process then has the DataLoader's queue feeder threads
(the standard library's, asleep until the main thread puts an index), which post nothing."""
import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
batches = iter(DataLoader(TensorDataset(torch.arange(32.0)), batch_size=4, num_workers=2))
t = next(batches)[0][:2]
if rank == 0:
    dist.recv(t, src=1)
else:
    dist.barrier()
