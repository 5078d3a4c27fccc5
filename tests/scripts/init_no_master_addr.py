"""A script that starts its own rank (no torchrun) with env:// but forgets MASTER_ADDR (or
sets a bad MASTER_PORT): torch 2.13's rendezvous raises ValueError at init's start.

    python init_no_master_addr.py [MASTER_PORT]
"""
import os
import sys

import torch
import torch.distributed as dist

os.environ.pop("MASTER_ADDR", None)
if len(sys.argv) > 1:
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", sys.argv[1]
dist.init_process_group("gloo", rank=0, world_size=1)
t = torch.ones(1)
dist.all_reduce(t)
print("done", t.item(), flush=True)
dist.destroy_process_group()
