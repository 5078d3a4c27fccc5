"""Pipeline parallelism with torch.distributed.pipelining: an MLP of one block per rank, each
rank's block a stage (PipelineStage), trained with a GPipe or 1F1B schedule over
micro-batches; the schedules send activations and gradients between neighbouring stages
with batch_isend_irecv. The last stage prints the mean micro-batch loss, every rank an
all-reduced weight checksum.

    torchrun --nproc-per-node 3 examples/pipeline_schedules.py --schedule 1f1b
    simdist compare examples/pipeline_schedules.py --nproc-per-node 3 -- --schedule 1f1b
"""

import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

log = logging.getLogger("pp")


class Block(nn.Module):
    def __init__(self, d):
        super().__init__()
        self.lin = nn.Linear(d, d)

    def forward(self, x):
        return torch.relu(self.lin(x))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--schedule", choices=["gpipe", "1f1b"], default="gpipe")
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--microbatches", type=int, default=4)
    p.add_argument("--dim", type=int, default=16)
    args = p.parse_args()

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING, format="%(message)s")
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    stage_mod = Block(args.dim)  # every rank draws the same init, then keeps its own layer
    for _ in range(rank):
        stage_mod = Block(args.dim)
    device = torch.device("cpu")
    stage = PipelineStage(stage_mod, rank, world, device)
    loss_fn = nn.MSELoss()
    sched_cls = ScheduleGPipe if args.schedule == "gpipe" else Schedule1F1B
    schedule = sched_cls(stage, n_microbatches=args.microbatches, loss_fn=loss_fn)
    opt = torch.optim.SGD(stage_mod.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(1)
    for step in range(args.steps):
        x = torch.randn(8, args.dim, generator=g)
        y = torch.randn(8, args.dim, generator=g)
        opt.zero_grad()
        if rank == 0:
            schedule.step(x)
        elif rank == world - 1:
            losses = []
            schedule.step(target=y, losses=losses)
            print(f"step {step} loss {torch.stack(losses).mean().item():.6f}", flush=True)
        else:
            schedule.step()
        opt.step()
    w = stage_mod.lin.weight.detach().sum()
    dist.all_reduce(w)
    log.info("done, weight checksum %.5f", w.item())
    print(f"[rank{rank}] checksum {w.item():.5f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
