"""A script that ends with files it never closed, as scripts that log to a module-level
`open(...)` or `gzip.open(...)` do: the interpreter's shutdown writes them out (their
finalizers close them), so the log holds every line and the gzip file is whole (a gzip
file's end is written only when it is closed). Each rank writes `rank{R}.log` and
`rank{R}.log.gz` under the directory given as its argument, and prints an all-reduced sum.
Started torchrun-style."""

import gzip
import os
import sys

import torch
import torch.distributed as dist

RANK = os.environ["RANK"]
LOG = open(os.path.join(sys.argv[1], f"rank{RANK}.log"), "w")  # noqa: SIM115 (never closed)
ZLOG = gzip.open(os.path.join(sys.argv[1], f"rank{RANK}.log.gz"), "wt")  # noqa: SIM115 (never closed)


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    for step in range(3):
        LOG.write(f"rank {rank} step {step}\n")
        ZLOG.write(f"rank {rank} step {step}\n")
    total = torch.tensor([float(rank + 1)])
    dist.all_reduce(total)
    print(f"[rank{rank}] total {total.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
