"""Rank 1 leaves by the builtin `exit(3)` (what `site` gives every script, and transformers'
distributed Trainer test calls) or by `raise SystemExit(4)`, after a barrier; the others go
on to an all_reduce and lose their peer. argv[1]: "exit" or "raise". Any world size >= 2."""

import sys

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
if rank == 1:
    print("rank 1: leaving", flush=True)
    if sys.argv[1] == "exit":
        exit(3)
    raise SystemExit(4)
t = torch.ones(2)
dist.all_reduce(t)
print(f"rank {rank}: {t.tolist()}")
