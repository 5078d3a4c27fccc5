"""A GPU script's tensor parallelism, unmodified, on simulated GPUs: `init_device_mesh("cuda")`
initialises the default group itself (no `init_process_group` call in the script), and
DTensor's backward moves gradients to the mesh's device type ("cuda") inside autograd, below
the call the CUDA-to-CPU remap saw. Prints the rendezvous variables torchrun sets (as
pytorch/examples' ddp/example.py does: the same on both sides), the mesh, losses and
parameter sums."""

import os

import torch
import torch.nn as nn
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def main():
    env = {k: os.environ[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK")}
    mesh = init_device_mesh("cuda", (int(os.environ["WORLD_SIZE"]),))
    rank = mesh.get_rank()
    print(f"[{rank}] {env}", flush=True)
    print(f"[{rank}] {mesh}", flush=True)
    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(6, 8), nn.ReLU(), nn.Linear(8, 3)).to("cuda")
    model = parallelize_module(model, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        torch.manual_seed(step)
        loss = model(torch.rand(4, 6, device="cuda")).sum()
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"[{rank}] step {step} loss {loss.item():.6f}", flush=True)
    sums = [round(p.full_tensor().sum().item(), 6) for p in model.parameters()]
    print(f"[{rank}] params {sums}", flush=True)
    torch.distributed.destroy_process_group()


if __name__ == "__main__":
    main()
