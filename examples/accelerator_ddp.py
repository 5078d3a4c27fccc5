"""A DDP script written against the device-generic torch.accelerator API, as PyTorch's current
tutorials are: the device from current_accelerator() and LOCAL_RANK, set_device_index,
the backend from get_default_backend_for_device, init_process_group(device_id=...),
torch.accelerator.synchronize() after each step. On simulated GPUs it takes its GPU path
(before, torch.accelerator said "no accelerator" while torch.cuda said 8 GPUs).

    torchrun --nproc-per-node 2 examples/accelerator_ddp.py
    simdist compare examples/accelerator_ddp.py --nproc-per-node 2
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=4)
    args = p.parse_args()
    local_rank = int(os.environ["LOCAL_RANK"])
    acc = torch.accelerator.current_accelerator()
    if torch.accelerator.is_available():
        torch.accelerator.set_device_index(local_rank)
        device = torch.device(f"{acc.type}:{local_rank}")
    else:
        device = torch.device("cpu")
    backend = dist.get_default_backend_for_device(device)
    dist.init_process_group(backend=backend, device_id=device if device.type != "cpu" else None)
    rank = dist.get_rank()
    print(f"[rank{rank}] device {device} backend-asked {backend} accelerators {torch.accelerator.device_count()} "
          f"current {torch.accelerator.current_device_index()}", flush=True)
    torch.manual_seed(0)
    model = DDP(nn.Linear(8, 2).to(device), device_ids=[local_rank] if device.type != "cpu" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x, y = torch.randn(4, 8, generator=g).to(device), torch.randn(4, 2, generator=g).to(device)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        torch.accelerator.synchronize()
        if rank == 0:
            print(f"step {step} loss {loss.item():.6f}", flush=True)
    print(f"[rank{rank}] weight {model.module.weight.sum().item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
