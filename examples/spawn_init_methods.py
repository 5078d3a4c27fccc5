"""mp.spawn of 2 workers that rendezvous through init_method (file:// on a temporary file
the parent made, or tcp://) with rank and world_size given, no MASTER_ADDR in the
environment, train a DDP model a few steps and all-reduce the final loss.

    --tcp        init_method="tcp://127.0.0.1:<port>" instead of a file
    --fail R     worker R raises ValueError at step 2 (the parent gets ProcessRaisedException;
                 the others, in DDP's all_reduce, are SIGTERMed or see the peer's closure
                 first: a race of the real run)
"""
import argparse
import os
import tempfile

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

WORLD = 2


def worker(rank, init_method, fail):
    dist.init_process_group("gloo", init_method=init_method, rank=rank, world_size=WORLD)
    torch.manual_seed(0)
    model = DDP(nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(4):
        if rank == fail and step == 2:
            raise ValueError(f"worker {rank}: corrupt batch at step {step}")
        loss = model(torch.randn(5, 4, generator=g)).pow(2).mean()
        opt.zero_grad()
        loss.backward()
        opt.step()
    t = torch.tensor([loss.item()])
    dist.all_reduce(t)
    print(f"worker {rank}: mean final loss {t.item() / WORLD:.6f}", flush=True)
    dist.destroy_process_group()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--tcp", action="store_true")
    ap.add_argument("--fail", type=int, default=-1)
    args = ap.parse_args()
    if args.tcp:
        init = "tcp://127.0.0.1:29533"
        mp.spawn(worker, args=(init, args.fail), nprocs=WORLD)
    else:
        fd, path = tempfile.mkstemp()
        os.close(fd)
        os.remove(path)
        try:
            mp.spawn(worker, args=(f"file://{path}", args.fail), nprocs=WORLD)
        finally:
            if os.path.exists(path):
                os.remove(path)
    print("parent: all workers done", flush=True)


if __name__ == "__main__":
    main()
