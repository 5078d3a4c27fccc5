"""A script run under `CUDA_VISIBLE_DEVICES`, as users pick GPUs on a shared machine
(rasbt/LLMs-from-scratch's `DDP-script.py` asks to be run as `CUDA_VISIBLE_DEVICES=0,1 python
DDP-script.py`): it prints what torch.cuda sees, then each rank takes `cuda:{local_rank}` as
torchrun scripts do. A rank whose GPU is not visible fails in `set_device` with CUDA's "invalid
device ordinal"; with no GPU visible the script takes its CPU path, and `.cuda()` raises torch's
"No CUDA GPUs are available"."""

import os

import torch
import torch.distributed as dist

local_rank = int(os.environ["LOCAL_RANK"])
gpu = torch.cuda.is_available()
print(f"[{local_rank}] visible {os.environ.get('CUDA_VISIBLE_DEVICES')!r}: count {torch.cuda.device_count()}, "
      f"available {gpu}")
dist.init_process_group("gloo")
if gpu:
    torch.cuda.set_device(local_rank)
    print(f"[{local_rank}] uuid {torch.cuda.get_device_properties(local_rank).uuid}")
    t = torch.full((2,), float(local_rank + 1), device="cuda")
else:
    try:
        torch.ones(1).cuda()
    except RuntimeError as e:
        print(f"[{local_rank}] {type(e).__name__}: {e}")
    t = torch.full((2,), float(local_rank + 1))
dist.all_reduce(t)
print(f"[{local_rank}] sum {t.tolist()} on {t.device}")
dist.destroy_process_group()
