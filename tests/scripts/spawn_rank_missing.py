"""The tutorials' shape: the script sets MASTER_ADDR/MASTER_PORT and starts its ranks with
`mp.spawn`; `env://` without torchrun's agent store, so rank 0's init hosts the TCPStore
and waits for every rank's client there. One rank is missing from init.

    python spawn_rank_missing.py MODE MISSING NPROC [TIMEOUT_S [START]]

MODE: what rank MISSING does instead of coming: `exits` (exit code 0 before init), `raises`
(mp.spawn then ends every other rank at once, by SIGTERM), `sleeps<S>` (sleeps S seconds first), `joins` (nothing: every rank comes). TIMEOUT_S:
init_process_group's timeout (default: torch's, 30 min for Gloo). START: `spawn` (default:
`mp.spawn`, a fresh interpreter a rank) or `fork` (`mp.start_processes` with fork: the same
process context, which ends the others once one fails, without a torch import a rank).
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def main(rank, mode, missing, world, timeout):
    if rank == missing:
        if mode == "exits":
            sys.exit(0)
        if mode == "raises":
            raise RuntimeError("this rank fails before init")
        if mode.startswith("sleeps"):
            time.sleep(float(mode.removeprefix("sleeps")))
    kw = {"timeout": datetime.timedelta(seconds=timeout)} if timeout else {}
    dist.init_process_group("gloo", rank=rank, world_size=world, **kw)
    t = torch.ones(1)
    dist.all_reduce(t)
    print(rank, "done", t.item(), flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    mode, missing, world = sys.argv[1], int(sys.argv[2]), int(sys.argv[3])
    timeout = float(sys.argv[4]) if len(sys.argv) > 4 and sys.argv[4] != "none" else None
    start = sys.argv[5] if len(sys.argv) > 5 else "spawn"
    os.environ["MASTER_ADDR"] = "localhost"
    os.environ["MASTER_PORT"] = "12355"
    if start == "spawn":
        mp.spawn(main, args=(mode, missing, world, timeout), nprocs=world)
    else:
        mp.start_processes(main, args=(mode, missing, world, timeout), nprocs=world, start_method=start)
