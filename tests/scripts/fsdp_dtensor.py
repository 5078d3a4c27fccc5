"""A torchrun-style script on torch's sharding APIs over a CPU DeviceMesh with Gloo:
DTensor (distribute_tensor, Shard -> Replicate, full_tensor, a sharded matmul), tensor
parallelism (parallelize_module with ColwiseParallel and RowwiseParallel), FSDP
(FullyShardedDataParallel on the CPU) and FSDP2 (fully_shard), a few training steps each,
losses and full parameters printed. Any world size >= 2.

    --uneven   FSDP only, the last rank runs one step fewer and leaves: the others' next
               gradient reduce-scatter (an all_reduce on Gloo) fails
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor import Replicate, Shard, distribute_tensor
from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module


def make_model():
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4))


def train(model, rank, steps, tag, same_data=False):
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(10 + (0 if same_data else rank))  # tensor parallel: one batch
    for step in range(steps):
        x, y = torch.randn(6, 8, generator=g), torch.randn(6, 4, generator=g)
        loss = F.mse_loss(model(x), y)
        loss.backward()
        opt.step()
        opt.zero_grad()
        print(f"[{tag} rank{rank}] step {step} loss {loss.item():.8f}", flush=True)


def dtensors(mesh, rank, world):
    group = mesh.get_group()
    print(f"[mesh rank{rank}] {mesh} group {group.group_desc} world {group is dist.group.WORLD}", flush=True)
    torch.manual_seed(1)
    big = torch.randn(world * 3 + 1, 5)  # uneven rows: the last shard is shorter
    d = distribute_tensor(big, mesh, [Shard(0)])
    print(f"[dtensor rank{rank}] local {tuple(d.to_local().shape)} sum {d.to_local().sum().item():.6f}", flush=True)
    r = d.redistribute(mesh, [Replicate()])
    print(f"[dtensor rank{rank}] replicated equal {torch.equal(r.to_local(), big)}", flush=True)
    w = distribute_tensor(torch.randn(5, 4), mesh, [Replicate()])
    out = (d @ w).full_tensor()
    print(f"[dtensor rank{rank}] matmul {out.sum().item():.6f} {torch.allclose(out, big @ w.full_tensor())}",
          flush=True)
    s = distribute_tensor(torch.arange(world * 2.0) + rank, mesh, [Shard(0)])  # rank 0's values win
    print(f"[dtensor rank{rank}] full {s.full_tensor().tolist()} sum {s.sum().full_tensor().item()}", flush=True)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--uneven", action="store_true")
    ap.add_argument("--steps", type=int, default=2)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
    from torch.distributed.fsdp import fully_shard

    mesh = init_device_mesh("cpu", (world,))
    if not args.uneven:
        dtensors(mesh, rank, world)
        torch.manual_seed(0)
        tp = nn.Sequential(nn.Linear(8, 4 * world), nn.ReLU(), nn.Linear(4 * world, 4))
        train(parallelize_module(tp, mesh, {"0": ColwiseParallel(), "2": RowwiseParallel()}), rank, args.steps, "tp",
              same_data=True)
    if not args.uneven:
        try:  # torch refuses FSDP without a device_id on a CPU-only machine; on a GPU one (the
            # simulated GPUs) it takes the GPU, which here is the CPU (`rank/devices.py`)
            FSDP(make_model())
            print(f"[fsdp1 rank{rank}] no device_id: accepted", flush=True)
        except RuntimeError as e:
            print(f"[fsdp1 rank{rank}] no device_id: refused: {e}", flush=True)
    model = FSDP(make_model(), device_id=torch.device("cpu"))
    train(model, rank, args.steps - (args.uneven and rank == world - 1), "fsdp1")
    sums = {k: round(v.sum().item(), 6) for k, v in model.state_dict().items()}
    print(f"[fsdp1 rank{rank}] state {sums}", flush=True)
    if args.uneven:
        dist.destroy_process_group()
        return

    model = make_model()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer, mesh=mesh)
    fully_shard(model, mesh=mesh)
    train(model, rank, args.steps, "fsdp2")
    full = {k: round(v.full_tensor().sum().item(), 6) for k, v in model.state_dict().items()}
    print(f"[fsdp2 rank{rank}] full {full}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
