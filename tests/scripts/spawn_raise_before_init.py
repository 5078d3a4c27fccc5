"""A script that starts its own ranks (`mp.start_processes`, fork: no torch import a rank)
whose every rank raises before init_process_group: the run never has a process group.

    python spawn_raise_before_init.py NPROC
"""
import sys

import torch.multiprocessing as mp


def main(rank):
    raise ValueError(f"no config for rank {rank}")


if __name__ == "__main__":
    mp.start_processes(main, nprocs=int(sys.argv[1]), start_method="fork")
