#!/usr/bin/env python
"""Can a member of a fresh group exit while another is still connecting it? (raw Gloo, no simdist)

tests/scripts/new_group_side_thread.py's `exchange` program on 3 ranks forked from this
process (a FileStore rendezvous): each rank's side thread receives from the next rank, its
main thread makes `new_group(all ranks)` (the last rank 0.6 s late), sends its rank to the
previous rank, joins the thread and exits. Rank 1 is stopped (SIGSTOP) as soon as the last
rank's address for the group is in the store (the moment rank 1 starts connecting its pair
with it: a descheduled process on a loaded host) and let go on (SIGCONT) once rank 2 has
exited, or after `HOLD_S`:

* `exit`: the script as it was: rank 2 returns from new_group once ITS side of each pair is
  connected, gets rank 0's message (sent once rank 0's new_group returned) and exits while
  rank 1 may still be connecting: rank 1 fails in new_group ("Gloo connectFullMesh failed
  with ... Connection closed by peer"), and rank 0's receive from rank 1 with it.
* `barrier`: the same with `dist.barrier()` on the world before each rank exits: no rank can
  leave before every rank has entered the barrier, i.e. returned from its new_group.

    python bench/new_group_exit_probe.py exit|barrier [--repeat N]

Each run prints every rank's outcome in a word; at the end, each outcome with its count.
Every rank dies with the probe (PR_SET_PDEATHSIG); a run's ranks are killed after 30 s.
"""

from __future__ import annotations

import argparse
import collections
import multiprocessing as mp
import os
import sys
import tempfile
import threading
import time

import torch
import torch.distributed as dist
from gloo_closed_pair_probe import end_ranks, how, stop_while_connecting

from simdist.procs import die_with_parent

WORLD, LATE_S, HOLD_S, RUN_WALL_S = 3, 0.6, 3.0, 30.0
LAST_KEY = "0//1//cpu//0/2"  # the default group's prefix, the first new_group's, its device's: rank 2's address


def rank_main(rank: int, store_path: str, mode: str) -> None:
    die_with_parent()
    store = dist.FileStore(store_path, WORLD)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=WORLD)
    got, errors = torch.zeros(1), []

    def receive() -> None:
        time.sleep(0.3)
        try:
            dist.recv(got, (rank + 1) % WORLD)
        except RuntimeError as e:
            errors.append(f"recv: {how(e)}")

    thread = threading.Thread(target=receive)
    thread.start()
    if rank == WORLD - 1:
        time.sleep(LATE_S)
    try:
        dist.new_group(list(range(WORLD)))
        dist.send(torch.tensor([float(rank)]), (rank - 1) % WORLD)
        thread.join()
        if mode == "barrier":
            dist.barrier()
    except RuntimeError as e:
        errors.append(how(e))
    thread.join()
    with open(f"{store_path}.{rank}", "w") as f:  # its outcome, beside the store's file
        f.write("; ".join(errors) or f"ok (received {got.item():g})")
    os._exit(0)


def run_once(mode: str) -> str:
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        ctx = mp.get_context("fork")
        ranks = [ctx.Process(target=rank_main, args=(r, store_path, mode)) for r in range(WORLD)]
        t0 = time.monotonic()
        for p in ranks:
            p.start()
        try:
            stop_while_connecting(ranks, store_path, 1, LAST_KEY, until=WORLD - 1, wall_s=RUN_WALL_S, hold_s=HOLD_S)
            for p in ranks:
                p.join(max(0.1, RUN_WALL_S - (time.monotonic() - t0)))
        finally:
            end_ranks(ranks)
        said = {r: open(f"{store_path}.{r}").read() for r in range(WORLD) if os.path.exists(f"{store_path}.{r}")}
        return " | ".join(f"{r}: {said.get(r, 'no outcome (killed)')}" for r in range(WORLD))


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("mode", choices=("exit", "barrier"))
    ap.add_argument("--repeat", type=int, default=10)
    a = ap.parse_args()
    tally: collections.Counter[str] = collections.Counter()
    for k in range(a.repeat):
        outcome = run_once(a.mode)
        tally[outcome] += 1
        print(f"run {k}: {outcome}", flush=True)
    for outcome, n in tally.most_common():
        print(f"{n:3d} x {outcome}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
