"""DDP training from a DataLoader with a DistributedSampler -- and no Join.

A typical torchrun script: a tiny synthetic regression dataset split across ranks by
DistributedSampler, a small model under DistributedDataParallel, SGD. With the sampler
every rank gets the same number of batches and the script works. If one rank gets fewer
batches (a filtered dataset, drop_last differences, a sharded reader), it leaves the loop
early while the others still wait in DDP's gradient all-reduce inside loss.backward():
the job hangs (NCCL) or fails (Gloo: "Connection closed by peer").

    torchrun --nproc-per-node 2 examples/fuzz_ddp_dataloader_no_join.py
    simdist run examples/fuzz_ddp_dataloader_no_join.py --nproc-per-node 2 --batches 3,4
    simdist fuzz examples/fuzz_ddp_dataloader_no_join.py --nproc-per-node-range 2:4 --budget 50

The fixed version is fuzz_ddp_dataloader_join.py (the loop under Join).
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, TensorDataset
from torch.utils.data.distributed import DistributedSampler


def parse_args():
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=1)
    p.add_argument("--batch-size", type=int, default=4)
    p.add_argument("--samples", type=int, default=96)
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


def main():
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank = dist.get_rank()
    local_rank = int(os.environ["LOCAL_RANK"])
    if backend == "nccl":
        torch.cuda.set_device(local_rank)
        device = torch.device(f"cuda:{local_rank}")
    else:
        device = torch.device("cpu")

    g = torch.Generator().manual_seed(0)
    x = torch.randn(args.samples, 8, generator=g)
    y = x @ torch.linspace(-1, 1, 8).unsqueeze(1) + 0.1
    dataset = TensorDataset(x, y)
    sampler = DistributedSampler(dataset, shuffle=True, seed=0)
    loader = DataLoader(dataset, batch_size=args.batch_size, sampler=sampler)

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.ReLU(), torch.nn.Linear(16, 1)).to(device)
    model = DDP(net, device_ids=[local_rank] if backend == "nccl" else None)
    opt = torch.optim.SGD(model.parameters(), lr=args.lr)

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        steps = 0
        for xb, yb in loader:
            xb, yb = xb.to(device), yb.to(device)
            opt.zero_grad()
            loss = F.mse_loss(model(xb), yb)
            loss.backward()
            opt.step()
            steps += 1
        print(f"rank {rank}: epoch {epoch} done after {steps} batches")

    dist.destroy_process_group()


if __name__ == "__main__":
    main()
