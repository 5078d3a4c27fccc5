"""RPC (`torch.distributed.rpc`: remote calls, RRefs, distributed autograd) is not modelled:
`init_rpc` is refused as bad input naming the call, the RPC worker and the user's line, also
in a process that never initialises a process group (pytorch/examples' `distributed/rpc/*`
call only `init_rpc`), instead of rendezvousing for real over TCP outside the simulation.

torchrun-style: `simdist run rpc_refused.py --nproc-per-node 2 [-- --after-group]`; with
`--after-group` each rank first all-reduces on its default group (a DDP + RPC hybrid)."""

import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.rpc as rpc

rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
if "--after-group" in sys.argv:
    dist.init_process_group("gloo")
    t = torch.ones(1)
    dist.all_reduce(t)
    print(f"[{rank}] {t.item()}")
rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world)
print(f"[{rank}] RPC up")
rpc.shutdown()
