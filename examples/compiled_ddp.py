"""torch.compile of a DDP-wrapped model, as the DDP + compile recipe has it: dynamo's
DDPOptimizer splits the graph at DDP's bucket boundaries so that the all-reduces overlap the
backward. Started torchrun-style; rank 0 logs the loss, every rank prints a checksum of its
parameters. --compile-backend picks the backend (default aot_eager; inductor compiles C++
and takes minutes on a small CPU).

    torchrun --nproc-per-node 2 examples/compiled_ddp.py
    simdist compare examples/compiled_ddp.py --nproc-per-node 2
"""

import argparse
import logging
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

log = logging.getLogger(__name__)


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--compile-backend", default="aot_eager")
    args = p.parse_args()
    rank = int(os.environ["RANK"])
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.ERROR, format="%(message)s")
    dist.init_process_group("gloo")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(16, 64), nn.ReLU(), nn.Linear(64, 64), nn.ReLU(), nn.Linear(64, 4))
    model = DDP(net)
    model = torch.compile(model, backend=args.compile_backend)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2)
    g = torch.Generator().manual_seed(100 + rank)
    for step in range(args.steps):
        x, y = torch.randn(8, 16, generator=g), torch.randn(8, 4, generator=g)
        loss = nn.functional.mse_loss(model(x), y)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        log.info("step %d loss %.6f", step, loss.item())
    checksum = sum(p.detach().double().sum() for p in net.parameters())
    print(f"[rank{rank}] checksum {checksum.item():.8f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
