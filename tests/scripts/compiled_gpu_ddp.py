"""torch.compile with its default backend (inductor) of a 2-layer MLP under DDP on the GPUs,
as nanoGPT and build-nanogpt do (`model = torch.compile(model)`): two training steps; each rank
prints its losses and a checksum of its parameters. `--backend eager` runs the same steps
uncompiled, for the values to compare with; `--wrap none` averages the gradients by hand
(`all_reduce` of each) instead of DDP. Started torchrun-style."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="inductor", choices=["inductor", "eager"])
    p.add_argument("--wrap", default="ddp", choices=["ddp", "none"])
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    local = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 2)).to(f"cuda:{local}")
    model = DDP(net, device_ids=[local]) if args.wrap == "ddp" else net
    if args.backend == "inductor":
        model = torch.compile(model)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(10 + rank)
    losses = []
    for _ in range(2):
        x, y = torch.randn(4, 8, generator=g).cuda(), torch.randn(4, 2, generator=g).cuda()
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        if args.wrap == "none":
            for q in net.parameters():
                dist.all_reduce(q.grad)
                q.grad /= dist.get_world_size()
        opt.step()
        losses.append(round(loss.item(), 4))
    checksum = sum(q.detach().double().sum() for q in net.parameters()).item()
    print(f"[rank{rank}] losses: {losses}", flush=True)
    print(f"[rank{rank}] checksum: {checksum:.4f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
