"""Ask for NCCL as GPU scripts do: `nccl`, the `cpu:gloo,cuda:nccl` pair, or Gloo for the world
and `new_group(backend="nccl")`; print what the call raised (a CPU build of torch has no NCCL)."""

import sys

import torch.distributed as dist

how = sys.argv[1]
try:
    if how == "new_group":
        dist.init_process_group("gloo")
        # Gloo's init returns once a rank's own side of each pair is up: without this barrier
        # rank 0 could raise below and exit while rank 1 is still connecting (a connect race
        # of the real run, seen once at load 20), which is not what this script is about
        dist.barrier()
        dist.new_group(backend="nccl")
    else:
        dist.init_process_group(how)
except RuntimeError as e:
    print(f"[{dist.get_rank() if dist.is_initialized() else '?'}] raised {e}")
    raise
print("initialised")
dist.destroy_process_group()
