"""Collectives issued inside `loss.backward()` by three different owners, each in its own
part: FSDP2's gradient reduce-scatter (its post-backward hook, Python), tensor parallelism's
input-gradient all-reduce (DTensor's redistribution under autograd, Python), and DDP's
gradient bucket (its C++ reducer). Only the last is DDP's bucket all-reduce; the report named
all three so (any collective under autograd was), and `simdist run` of pytorch/examples'
`fsdp_tp_example.py`, which has no DDP, said its ranks' last operation was "DDP reducer:
gradient bucket all-reduce". Prints a value from each part for the comparison."""

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module
from torch.nn.parallel import DistributedDataParallel as DDP


def model() -> torch.nn.Module:
    torch.manual_seed(0)
    return torch.nn.Sequential(torch.nn.Linear(4, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2))


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    x = torch.ones(3, 4) * (rank + 1)
    fsdp = fully_shard(model(), mesh=mesh)
    fsdp(x).sum().backward()  # FSDP2: all-gathers in forward, a reduce-scatter in backward
    print(f"[{rank}] fsdp2 {fsdp[0].weight.grad.to_local().sum().item():.4f}", flush=True)
    tp = parallelize_module(model(), mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()})
    xt = x.clone().requires_grad_()
    tp(xt).sum().backward()  # TP: RowwiseParallel's forward all-reduce, ColwiseParallel's in backward
    print(f"[{rank}] tp {xt.grad.sum().item():.4f}", flush=True)
    ddp = DDP(model())
    ddp(x).sum().backward()  # DDP: one gradient bucket
    print(f"[{rank}] ddp {ddp.module[0].weight.grad.sum().item():.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
