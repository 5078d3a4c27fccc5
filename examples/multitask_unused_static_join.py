"""A multi-task model where one head is used only for some batches, trained with DDP: each
rank reads its own file shard (uneven: rank r has 4 + r batches). --mode unused wraps it
with find_unused_parameters=True, --mode static with static_graph=True (the aux head is then
used on every batch, as static_graph requires). Without --join the ranks' extra batches
synchronise with nobody; with --join the shorter ranks shadow them.

    torchrun --nproc-per-node 2 examples/multitask_unused_static_join.py --mode static --join
    simdist compare examples/multitask_unused_static_join.py --nproc-per-node 2 -- --mode unused --join
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


class MultiTask(nn.Module):
    def __init__(self):
        super().__init__()
        self.trunk = nn.Linear(6, 8)
        self.main = nn.Linear(8, 1)
        self.aux = nn.Linear(8, 3)

    def forward(self, x, with_aux):
        h = torch.tanh(self.trunk(x))
        return self.main(h), (self.aux(h) if with_aux else None)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--mode", choices=["unused", "static"], default="unused")
    ap.add_argument("--join", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = MultiTask()
    ddp = DDP(model, find_unused_parameters=args.mode == "unused", static_graph=args.mode == "static")
    opt = torch.optim.Adam(ddp.parameters(), lr=0.01)
    g = torch.Generator().manual_seed(100 + rank)
    shard = [(torch.randn(4, 6, generator=g), torch.randn(4, 1, generator=g), torch.randint(0, 3, (4,), generator=g))
             for _ in range(4 + rank)]
    ctx = Join([ddp]) if args.join else open(os.devnull)
    with ctx:
        for step, (x, y, c) in enumerate(shard):
            with_aux = args.mode == "static" or step % 2 == 0
            out, aux = ddp(x, with_aux)
            loss = F.mse_loss(out, y)
            if aux is not None:
                loss = loss + 0.1 * F.cross_entropy(aux, c)
            opt.zero_grad()
            loss.backward()
            torch.nn.utils.clip_grad_norm_(ddp.parameters(), 0.5)
            opt.step()
    flat = torch.cat([p.detach().flatten() for p in ddp.parameters()])
    copy = flat.clone()
    dist.broadcast(copy, src=0)
    print(f"rank {rank}: {len(shard)} steps, replicas equal {torch.equal(flat, copy)}, "
          f"checksum {flat.sum().item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
