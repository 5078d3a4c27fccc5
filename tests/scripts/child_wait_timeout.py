"""Rank 0 runs a command (a child process: `sleep SECONDS`, standing for a download) while the
others wait at a barrier of a group with a TIMEOUT s timeout (argv: TIMEOUT SECONDS HOW, HOW
one of run, check_output, system; pool or imap: two multiprocessing.Pool workers that sleep,
their results by `map`, or by `imap` in a for loop). On real Gloo, with SECONDS well past TIMEOUT, ranks 1 and 2
time out and torchrun's agent SIGTERMs rank 0 in its wait: it never prints. The simulator
counted only the CPU of rank 0's thread, which the wait does not use: rank 0 reached the
barrier at once and every rank completed."""

import multiprocessing
import os
import subprocess
import sys
import time
from datetime import timedelta

import torch.distributed as dist


def _preprocess(seconds: str) -> str:
    time.sleep(float(seconds))
    return seconds


def main():
    timeout, seconds, how = float(sys.argv[1]), sys.argv[2], sys.argv[3]
    dist.init_process_group("gloo", timeout=timedelta(seconds=timeout))
    rank = dist.get_rank()
    dist.barrier()
    if rank == 0:
        if how == "run":
            subprocess.run(["sleep", seconds], check=True)
        elif how == "check_output":
            subprocess.check_output(["sh", "-c", f"sleep {seconds}; echo fetched"])
        elif how == "system":
            os.system(f"sleep {seconds}")
        elif how == "imap":  # (a for loop calls the iterator's `__next__`, not its `next`)
            with multiprocessing.get_context("fork").Pool(2) as pool:
                for _ in pool.imap(_preprocess, [seconds, seconds]):
                    pass
        else:
            with multiprocessing.get_context("fork").Pool(2) as pool:
                pool.map(_preprocess, [seconds, seconds])
        print("rank 0 fetched the data", flush=True)
    dist.barrier()
    print(f"rank {rank} past the barrier", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
