"""DDP training as an ML team writes it: DistributedSampler over a dataset whose length
is not a multiple of the world size, DataLoader with 2 worker processes and pinned memory,
set_epoch, gradient clipping, logging with the rank in the format, @record on main, a
checkpoint saved by rank 0 behind a barrier and loaded back by every rank.

    torchrun --nproc-per-node 3 examples/ddp_workers_checkpoint.py --epochs 2
    simdist compare examples/ddp_workers_checkpoint.py --nproc-per-node 3

The checkpoint goes to the temporary folder (--ckpt), loaded with map_location=cuda:<rank>
where a GPU is (simulated ranks have them: the storages land on the CPU).
"""

import argparse
import logging
import os
import sys
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.elastic.multiprocessing.errors import record
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, Dataset, DistributedSampler

log = logging.getLogger("train")


class Squares(Dataset):
    def __init__(self, n):
        g = torch.Generator().manual_seed(7)
        self.x = torch.randn(n, 4, generator=g)
        self.y = (self.x ** 2).sum(dim=1, keepdim=True)

    def __len__(self):
        return len(self.x)

    def __getitem__(self, i):
        return self.x[i], self.y[i]


@record
def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--n", type=int, default=23)
    ap.add_argument("--drop-last", action="store_true")
    ap.add_argument("--ckpt", default=os.path.join(tempfile.gettempdir(), "ddp_workers_checkpoint.pt"))
    args = ap.parse_args()

    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = int(os.environ["LOCAL_RANK"])
    logging.basicConfig(level=logging.INFO, format=f"[rank{rank}] %(levelname)s %(message)s",
                        handlers=[logging.StreamHandler(sys.stdout)])
    device = torch.device("cuda", local_rank) if torch.cuda.is_available() else torch.device("cpu")
    torch.cuda.set_device(local_rank) if torch.cuda.is_available() else None

    torch.manual_seed(0)
    model = nn.Sequential(nn.Linear(4, 16), nn.ReLU(), nn.Linear(16, 1)).to(device)
    ddp = DDP(model, device_ids=[local_rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)

    ds = Squares(args.n)
    sampler = DistributedSampler(ds, shuffle=True, seed=1, drop_last=args.drop_last)
    loader = DataLoader(ds, batch_size=3, sampler=sampler, num_workers=2, pin_memory=True,
                        persistent_workers=True)
    log.info("dataset %d, %d samples a rank, %d batches", len(ds), len(sampler), len(loader))

    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        total, steps = torch.zeros(1, device=device), 0
        for x, y in loader:
            x, y = x.to(device, non_blocking=True), y.to(device, non_blocking=True)
            opt.zero_grad(set_to_none=True)
            loss = F.mse_loss(ddp(x), y)
            loss.backward()
            norm = torch.nn.utils.clip_grad_norm_(ddp.parameters(), max_norm=1.0)
            opt.step()
            total += loss.detach()
            steps += 1
        dist.all_reduce(total)
        log.info("epoch %d: %d steps, grad norm %.5f, mean loss %.5f", epoch, steps, norm.item(),
                 total.item() / (steps * world))
        if rank == 0:
            torch.save({"epoch": epoch, "model": ddp.module.state_dict(), "opt": opt.state_dict()}, args.ckpt)
        dist.barrier()
        state = torch.load(args.ckpt, map_location=device, weights_only=True)
        ddp.module.load_state_dict(state["model"])
        log.info("resumed from epoch %d", state["epoch"])
    dist.barrier()  # every rank has read the last checkpoint before rank 0 removes it
    if rank == 0:
        os.remove(args.ckpt)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
