"""FSDP (v1) as a GPU script writes it: the module moved to `cuda:{rank}` and wrapped with no
`device_id` (the DCP recipe, the FSDP tutorial), or with `device_id=torch.cuda.current_device()`
(nested by an auto-wrap policy). On the simulated GPUs both run on the CPU they stand for;
before, FSDP found no parameter off the CPU, asked torch for a non-CPU accelerator and raised
"FSDP needs a non-CPU accelerator device" on both sides. (`sync_module_states=True` still
fails on both sides: FSDP checks that no parameter is on the CPU, docs/script-backend.md.)
Then a torch.distributed.checkpoint save, which under the NCCL semantics the script asks for
(`simdist run`) asks `torch.cuda.nccl.version()`: it failed in the simulator alone.

torchrun-style: `simdist compare fsdp_gpu_defaults.py --nproc-per-node 2`."""

import functools
import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp.wrap import size_based_auto_wrap_policy

rank = int(os.environ["LOCAL_RANK"])
dist.init_process_group("nccl")
torch.cuda.set_device(rank)
torch.manual_seed(0)


def net() -> nn.Module:
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).to(rank)


for name, wrap in (("plain", lambda m: FSDP(m)),
                   ("device_id", lambda m: FSDP(m, device_id=torch.cuda.current_device(),
                                                auto_wrap_policy=functools.partial(size_based_auto_wrap_policy,
                                                                                   min_num_params=50)))):
    model = wrap(net())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    x = torch.arange(24.0, device="cuda").reshape(3, 8) / 24 + rank
    loss = model(x).square().mean()
    loss.backward()
    opt.step()
    with FSDP.summon_full_params(model):
        total = sum(p.sum().item() for p in model.parameters())
    print(f"[{rank}] {name}: {type(model).__name__} on {next(model.parameters()).device}, "
          f"loss {loss.item():.6f}, params {total:.6f}")
dcp.save({"loss": loss.detach()}, checkpoint_id="fsdp_gpu_defaults_ckpt")  # asks the NCCL version under NCCL
dist.destroy_process_group()
