#!/usr/bin/env python
"""Which waits does a peer's exit fail on raw Gloo, and when? (no simdist in the ranks)

Three ranks forked from this process (torch imported once), a FileStore rendezvous, one
side group. Each case prints every rank's events with the time since the start, so the
order of a closure and the waits it ends can be read:

* isend_wait2 / isend_wait1: rank 0 isends to ranks 1 and 2 and waits on one then the
  other; rank 1 exits at 0.2 s without receiving; rank 2 receives at 1 s.
* irecv_other: rank 0 irecvs from ranks 1 and 2; rank 1 exits at 0.2 s without sending.
* bcast_fed: a broadcast from rank 0; rank 1 gets it and exits; rank 2 posts at 1 s.
* bcast_unfed: the same, rank 1 exits at 0.2 s without posting.
* send_in_flight: rank 0 sends 400 MB to rank 1, which had posted its receive and dies 30 ms
  later, mid-transfer: the partly written send sits in the pair's transmit queue, which the
  closure does not reach for an unbound buffer (`Pair::signalException` looks at `op.buf`
  only), so rank 0's wait ends by its timeout (5 s), not with the peer gone.
* connect_race: tests/scripts/timed_out_root_fed.py's program (root timeout 5 s here), with
  rank 2 stopped (SIGSTOP) as soon as it has published its address for `new_group` and let
  go on (SIGCONT) once rank 1 has exited: a rank descheduled while connecting the group.
  Where the stop lands decides: rank 2 fails in `new_group` with rank 1's closure and the
  root with rank 2's (what a loaded host did once in CI), or nothing happens, or the others
  wait in `new_group` for rank 2 until a timeout.

    python bench/gloo_closed_pair_probe.py [CASE ...] [--repeat N] [--elems N] [--dies-after S]

Every rank dies with the probe (PR_SET_PDEATHSIG); a case's ranks are killed after 30 s.
"""

from __future__ import annotations

import argparse
import datetime
import multiprocessing as mp
import os
import signal
import sys
import tempfile
import time

import torch
import torch.distributed as dist

from simdist.procs import die_with_parent

CASE_WALL_S = 30.0
_T0: list[float] = [0.0]


def log(rank: int | str, msg: str) -> None:
    print(f"{time.monotonic() - _T0[0]:7.3f} [{rank}] {msg}", flush=True)


def how(e: BaseException) -> str:
    s = str(e)
    kind = "timed out" if "Timed out" in s else "peer gone (closed)" if "closed by peer" in s else s.splitlines()[0][:90]
    return kind + (" in new_group (connectFullMesh)" if "connectFullMesh" in s else "")


def _p2p(rank: int, case: str, g, t: torch.Tensor) -> None:
    if rank == 0:
        op = dist.isend if case.startswith("isend") else dist.irecv
        works = {1: op(t, 1, group=g), 2: op(t.clone(), 2, group=g)}
        for peer in (1, 2) if case == "isend_wait1" else (2, 1):
            try:
                works[peer].wait()
                log(rank, f"op with rank {peer} done")
            except RuntimeError as e:
                log(rank, f"op with rank {peer}: {how(e)}")
    elif rank == 1:
        time.sleep(0.2)
        log(rank, "exits")
        os._exit(0)
    else:
        time.sleep(1.0)
        (dist.recv if case.startswith("isend") else dist.send)(t, 0, group=g)
        log(rank, "done")


def _broadcast(rank: int, case: str, g, t: torch.Tensor) -> None:
    if rank == 1 and case == "bcast_unfed":
        time.sleep(0.2)
        log(rank, "exits without posting")
        os._exit(0)
    if rank == 2:
        time.sleep(0.6 if case == "connect_race" else 1.0)
    dist.broadcast(t, src=0, group=g)
    log(rank, "broadcast done")
    if rank == 1:
        log(rank, "exits")
        os._exit(0)


IN_FLIGHT_ELEMS = [100_000_000]  # send_in_flight's float32 elements (--elems)
DIES_AFTER_S = [0.03]  # when send_in_flight's receiver dies after posting its receive (--dies-after)


def _in_flight(rank: int, g) -> None:
    t = torch.zeros(IN_FLIGHT_ELEMS[0])
    if rank == 0:
        dist.send(t, 1, group=g)
        log(rank, "send done")
    elif rank == 1:
        work = dist.irecv(t, 0, group=g)
        time.sleep(DIES_AFTER_S[0])
        log(rank, f"dies mid-transfer (received: {work.is_completed()})")
        os._exit(0)


def rank_main(rank: int, store_path: str, case: str) -> None:
    die_with_parent()
    store = dist.FileStore(store_path, 3)
    dist.init_process_group("gloo", store=store, rank=rank, world_size=3)
    try:
        g = dist.new_group(timeout=datetime.timedelta(seconds=5))
        if case != "connect_race":
            dist.barrier(group=g)  # the group is connected on every rank before anyone leaves
        t = torch.full((4,), float(rank))
        if case == "send_in_flight":
            _in_flight(rank, g)
        else:
            (_p2p if case.startswith(("isend", "irecv")) else _broadcast)(rank, case, g, t)
    except RuntimeError as e:
        log(rank, how(e))
    time.sleep(2.0)  # stay up: the store's file and the others' view of this rank
    os._exit(0)


def stop_while_connecting(ranks: list, store_path: str, stopped: int, key: str, until: int,
                          wall_s: float, hold_s: float = 10.0) -> None:
    """SIGSTOP rank `stopped` once `key` (a rank's Gloo address for a group) is in the store;
    SIGCONT once rank `until` has exited (or after `hold_s`): the stopped rank is then still
    connecting the group when its peer runs on (also `bench/new_group_exit_probe.py`)."""
    store = dist.FileStore(store_path, len(ranks))
    deadline = time.monotonic() + wall_s
    while not store.check([key]) and time.monotonic() < deadline:
        time.sleep(0.0005)
    os.kill(ranks[stopped].pid, signal.SIGSTOP)
    ranks[until].join(hold_s)
    os.kill(ranks[stopped].pid, signal.SIGCONT)


def end_ranks(ranks: list) -> None:
    """Every rank process ends, a stopped one included (SIGCONT, then SIGKILL)."""
    for p in ranks:
        if p.is_alive():
            os.kill(p.pid, signal.SIGCONT)
            p.kill()
            p.join()


def run_case(case: str) -> None:
    with tempfile.TemporaryDirectory() as tmp:
        store_path = os.path.join(tmp, "store")
        _T0[0] = time.monotonic()
        ctx = mp.get_context("fork")
        ranks = [ctx.Process(target=rank_main, args=(r, store_path, case)) for r in range(3)]
        for p in ranks:
            p.start()
        try:
            if case == "connect_race":
                # the default group's prefix, the first new_group's, its device's: rank 2's address
                stop_while_connecting(ranks, store_path, 2, "0//1//cpu//0/2", until=1, wall_s=CASE_WALL_S)
                log("probe", "rank 2 stopped until rank 1 exited")
            for p in ranks:
                p.join(max(0.1, CASE_WALL_S - (time.monotonic() - _T0[0])))
        finally:
            end_ranks(ranks)


CASES = ("isend_wait2", "isend_wait1", "irecv_other", "bcast_fed", "bcast_unfed", "send_in_flight", "connect_race")


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("cases", nargs="*", help=f"of {', '.join(CASES)} (default: all)")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--elems", type=int, default=IN_FLIGHT_ELEMS[0], help="send_in_flight: float32 elements sent")
    ap.add_argument("--dies-after", type=float, default=DIES_AFTER_S[0],
                    help="send_in_flight: seconds between the receiver's irecv and its death")
    a = ap.parse_args()
    IN_FLIGHT_ELEMS[0], DIES_AFTER_S[0] = a.elems, a.dies_after
    if unknown := [c for c in a.cases if c not in CASES]:
        ap.error(f"unknown case {unknown[0]!r}: expected one of {', '.join(CASES)}")
    for case in a.cases or CASES:
        for k in range(a.repeat):
            print(f"== {case} ({k + 1}/{a.repeat})", flush=True)
            run_case(case)
    return 0


if __name__ == "__main__":
    sys.exit(main())
