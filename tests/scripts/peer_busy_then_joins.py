"""Rank 0 waits in an all_reduce while rank 1 is busy before it joins: `sleep` (time.sleep)
or `compute` (tensor work on its main thread) for SECONDS, longer than the early hang
verdict's settle period in the tests. Not a hang: both ranks complete, on both sides."""
import sys
import time

import torch
import torch.distributed as dist

how, seconds = sys.argv[1], float(sys.argv[2])
dist.init_process_group("gloo")
rank = dist.get_rank()
t = torch.ones(2)
dist.all_reduce(t)
if rank == 1:
    if how == "sleep":
        time.sleep(seconds)
    else:
        end, x = time.monotonic() + seconds, torch.ones(64, 64)
        while time.monotonic() < end:
            x = torch.tanh(x @ x)
dist.all_reduce(t)
print(rank, "done", t.tolist(), flush=True)
dist.destroy_process_group()
