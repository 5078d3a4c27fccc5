"""How a torchrun-style script ends when one rank goes wrong: --case picks the failure.

  raise        rank 1 raises in its training loop (ValueError), the others are in an all_reduce
  exit         rank 1 calls sys.exit(3) after a barrier; the others go on to an all_reduce
  os_exit      rank 1 calls os._exit(0) mid-loop
  monitored    rank 1 skips a monitored_barrier: rank 0 reports it by name
  monitored_ok every rank calls monitored_barrier (wait_all_ranks=True), then trains on
  mismatch     rank 1 all-reduces a different size than the others
Any world size >= 2."""

import argparse
import datetime
import logging
import os
import sys

import torch
import torch.distributed as dist

log = logging.getLogger("failures")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", required=True)
    ap.add_argument("--steps", type=int, default=3)
    ap.add_argument("--pg-timeout", type=float, default=60.0, help="Gloo's timeout (seconds) for a stuck collective")
    args = ap.parse_args()
    logging.basicConfig(level=logging.WARNING)
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.pg_timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    w = torch.ones(4)
    for step in range(args.steps):
        g = torch.full((4,), float(rank + step))
        if args.case == "raise" and rank == 1 and step == 1:
            raise ValueError(f"bad batch at step {step}")
        if args.case == "os_exit" and rank == 1 and step == 2:
            print(f"rank {rank}: leaving abruptly", flush=True)
            os._exit(0)
        if args.case == "mismatch" and rank == 1 and step == 1:
            g = torch.zeros(5)
        dist.all_reduce(g)
        if args.case == "mismatch" and step == 1:
            print(f"rank {rank} step {step}: summed {g.tolist()}", flush=True)  # what Gloo's ring left
        w -= 0.1 * g[:4] / world
        print(f"rank {rank} step {step}: w0 {w[0].item():.4f}", flush=True)
    if args.case == "exit":
        dist.barrier()
        if rank == 1:
            print("rank 1: done early, exiting 3", flush=True)
            sys.exit(3)
        dist.all_reduce(w)
    if args.case in ("monitored", "monitored_ok"):
        if args.case == "monitored_ok" or rank != 1:
            try:
                dist.monitored_barrier(timeout=datetime.timedelta(seconds=2), wait_all_ranks=args.case == "monitored_ok")
                print(f"rank {rank}: monitored_barrier passed", flush=True)
            except RuntimeError as e:
                print(f"rank {rank}: monitored_barrier: {str(e).splitlines()[0]}", flush=True)
                raise
        dist.all_reduce(w)
    print(f"rank {rank}: finished, w {w.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
