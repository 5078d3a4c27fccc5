"""FSDP2 as a GPU user writes it: torch.cuda.set_device, init_device_mesh("cuda"), the model
built on cuda, fully_shard per block then the root with a bf16 MixedPrecisionPolicy,
activation checkpointing of each block, gradient clipping (a DTensor norm), and DCP's
get_model_state_dict for a full state dict on rank 0. --meta builds the model on the meta
device, then to_empty(device="cuda") and reset_parameters: DTensor's random ops on a cuda
mesh need CUDA's generator, which the simulated GPUs lack (refused, named). Started
torchrun-style."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.checkpoint.state_dict import StateDictOptions, get_model_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard
from torch.utils.checkpoint import checkpoint


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.ff = nn.Sequential(nn.Linear(d, 2 * d), nn.GELU(), nn.Linear(2 * d, d))
        self.norm = nn.LayerNorm(d)

    def forward(self, x):
        return x + self.ff(self.norm(x))


class Net(nn.Module):
    def __init__(self, d, n, ckpt):
        super().__init__()
        self.blocks = nn.ModuleList(Block(d) for _ in range(n))
        self.head = nn.Linear(d, 1)
        self.ckpt = ckpt

    def forward(self, x):
        for b in self.blocks:
            x = checkpoint(b, x, use_reentrant=False) if self.ckpt else b(x)
        return self.head(x)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--no-ckpt", action="store_true")
    p.add_argument("--meta", action="store_true", help="build on the meta device, then to_empty + reset_parameters")
    args = p.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))
    rank = dist.get_rank()
    torch.manual_seed(0)
    with torch.device("meta" if args.meta else "cuda"):
        model = Net(16, 2, not args.no_ckpt)
    mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for b in model.blocks:
        fully_shard(b, mesh=mesh, mp_policy=mp)
    fully_shard(model, mesh=mesh, mp_policy=mp)
    if args.meta:
        model.to_empty(device="cuda")
        torch.manual_seed(0)
        for m in model.modules():
            if hasattr(m, "reset_parameters"):
                m.reset_parameters()
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(4, 16, generator=g).cuda()
        y = torch.randn(4, 1, generator=g).cuda()
        loss = nn.functional.mse_loss(model(x).float(), y)
        loss.backward()
        norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        opt.zero_grad()
        print(f"[rank{rank}] step {step} loss {loss.item():.6f} norm {norm.full_tensor().item():.6f}", flush=True)
    sd = get_model_state_dict(model, options=StateDictOptions(full_state_dict=True, cpu_offload=True))
    if rank == 0:
        print(f"[rank0] full state dict {len(sd)} tensors, head {sd['head.weight'].sum().item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
