"""A hang with a DataLoader's worker processes alive: rank 0 waits in a recv nobody sends,
rank 1 in a barrier. The main process then has the DataLoader's queue feeder threads
(the standard library's, asleep until the main thread puts an index), which post nothing.
--pin-memory: and the DataLoader's pin-memory thread (the simulated GPUs are accelerators),
waiting for batches with a timeout, which posts nothing either."""
import sys

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

dist.init_process_group("gloo")
rank = dist.get_rank()
batches = iter(DataLoader(TensorDataset(torch.arange(32.0)), batch_size=4, num_workers=2,
                          pin_memory="--pin-memory" in sys.argv))
t = next(batches)[0][:2]
if rank == 0:
    dist.recv(t, src=1)
else:
    dist.barrier()
