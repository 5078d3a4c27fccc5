"""A script that picks its machine as users' scripts do: NCCL and `cuda:{local_rank}` when
`torch.cuda.is_available()`, else Gloo and the CPU; prints which, then all-reduces a tensor
on that device. With `--try-cuda` it also calls `.cuda()` after init, as a script written for
GPUs does whatever the machine (on a CPU build: torch's own "Torch not compiled with CUDA
enabled"). Run with `--gpus-per-node 0` (a CPU-only node) and with the default (8 GPUs)."""

import os
import sys

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
gpu = torch.cuda.is_available()
backend = "nccl" if gpu else "gloo"
device = torch.device(f"cuda:{local_rank}") if gpu else torch.device("cpu")
if gpu:
    torch.cuda.set_device(device)
dist.init_process_group(backend)
rank = dist.get_rank()
print(f"[{rank}] cuda available {gpu}, devices {torch.cuda.device_count()}, backend {backend}, device {device}, "
      f"cuda version {torch.version.cuda}")
t = torch.full((2,), float(rank + 1), device=device)
dist.all_reduce(t)
print(f"[{rank}] sum {t.tolist()} on {t.device.type}")
if "--try-cuda" in sys.argv:
    torch.ones(1).cuda()
dist.destroy_process_group()
