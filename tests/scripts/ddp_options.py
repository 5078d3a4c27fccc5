"""A torchrun-style DDP training script as people write them, exercising DDP's options:
DistributedSampler (uneven dataset, drop_last), a BatchNorm model (broadcast_buffers),
find_unused_parameters with a branch only some steps use, static_graph,
gradient_as_bucket_view, no_sync() gradient accumulation, a checkpoint written on rank 0
behind a barrier, losses all-reduced for logging. Any world size >= 2.

    --mode plain|unused|static  which DDP configuration to train
"""

import argparse
import logging
import os
import tempfile

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP
from torch.utils.data import DataLoader, DistributedSampler, TensorDataset

logger = logging.getLogger("train")


class Net(nn.Module):
    def __init__(self):
        super().__init__()
        self.fc1 = nn.Linear(6, 8)
        self.bn = nn.BatchNorm1d(8)
        self.fc2 = nn.Linear(8, 2)
        self.aux = nn.Linear(8, 2)  # used on some steps only

    def forward(self, x, use_aux=False):
        h = F.relu(self.bn(self.fc1(x)))
        out = self.fc2(h)
        return out + self.aux(h) if use_aux else out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", default="plain", choices=["plain", "unused", "static"])
    ap.add_argument("--epochs", type=int, default=2)
    ap.add_argument("--accum", type=int, default=2)
    args = ap.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    logging.basicConfig(level=logging.INFO, format=f"[%(levelname)s rank{local_rank}] %(message)s")
    dist.init_process_group(backend="gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)

    data = TensorDataset(torch.randn(10 * world + 3, 6), torch.randint(0, 2, (10 * world + 3,)))
    sampler = DistributedSampler(data, num_replicas=world, rank=rank, shuffle=True, seed=7,
                                 drop_last=args.mode == "static")
    loader = DataLoader(data, batch_size=4, sampler=sampler, drop_last=True)
    torch.manual_seed(100 + rank)  # replicas start different: DDP's constructor broadcasts rank 0's
    model = Net()
    ddp = DDP(model, find_unused_parameters=args.mode == "unused", static_graph=args.mode == "static",
              gradient_as_bucket_view=args.mode != "plain", broadcast_buffers=True)
    opt = torch.optim.SGD(ddp.parameters(), lr=0.05)
    print(f"rank {rank}: {len(loader)} batches of {len(sampler)} samples", flush=True)

    step = 0
    for epoch in range(args.epochs):
        sampler.set_epoch(epoch)
        running = torch.zeros(1)
        for i, (x, y) in enumerate(loader):
            use_aux = args.mode == "unused" and i % 2 == 1
            last = (i + 1) % args.accum == 0 or i + 1 == len(loader)
            if last:
                loss = F.cross_entropy(ddp(x, use_aux), y) / args.accum
                loss.backward()
                opt.step()
                opt.zero_grad(set_to_none=args.mode != "plain")
                step += 1
            else:
                with ddp.no_sync():
                    loss = F.cross_entropy(ddp(x, use_aux), y) / args.accum
                    loss.backward()
            running += loss.detach()
        dist.all_reduce(running, op=dist.ReduceOp.SUM)
        mean_bn = model.bn.running_mean.clone()
        dist.all_reduce(mean_bn, op=dist.ReduceOp.MAX)
        print(f"rank {rank} epoch {epoch}: loss {running.item() / world:.6f} steps {step} "
              f"bn max {mean_bn.sum().item():.6f} own bn {model.bn.running_mean.sum().item():.6f}", flush=True)

    ckpt_dir = os.environ.get("CKPT_DIR") or tempfile.gettempdir()
    path = os.path.join(ckpt_dir, f"ddp_options_{os.environ.get('TORCHELASTIC_RUN_ID', 'x')}_{os.getppid()}.pt")
    if rank == 0:
        torch.save(ddp.module.state_dict(), path)
        logger.info("saved checkpoint")
    dist.barrier()
    if rank == 0:
        os.remove(path)
    digest = torch.cat([p.detach().reshape(-1) for p in model.parameters()]).sum()
    sums = [torch.zeros(1) for _ in range(world)]
    dist.all_gather(sums, digest.reshape(1))
    print(f"rank {rank}: replicas equal {len({round(s.item(), 5) for s in sums}) == 1} "
          f"param sum {digest.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
