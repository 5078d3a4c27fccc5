"""Measure the primitives of the Gloo timing model on the real backend (`simdist calibrate`).

Usage from Python::

    from real_backend.calibrate import calibrate_host
    host = calibrate_host()          # a simdist.network.host.HostProfile

Two ranks (`real_backend.bench.run_ranks`: fresh processes, a loopback store, every
process ended however the run ends) measure, per message size: a ping-pong started by
rank 0 and one started by rank 1 (one message in flight, each direction; half a round
trip is one message), and an exchange (both ranks send to each other at once: two
messages in flight); then the fixed cost of one call into ProcessGroupGloo (`_call_cost`:
a barrier on the two ranks less its exchange; at least an all_reduce on a one-rank
group), and on one core the seconds per byte of a
float32 sum (Gloo's reduction) and of a copy. Per quantity: `repeats` passes over all
quantities, one batch of about 20 ms each after a barrier and one untimed call (warm, as
the benchmark's back-to-back calls are), at least `MIN_CALLS` calls, every single call timed; the
slowest rank's 25th percentile, and the spread (p75 - p25) / median kept so a noisy
calibration is visible. A message is never faster than a larger one, so a time above a
larger size's (load from other processes) is lowered to it.

Nothing here measures a collective: those are what the model predicts.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import time

from real_backend.bench import run_ranks, worker_main
from simdist.network.host import HostProfile
from simdist.procs import die_with_parent

MESSAGE_SIZES = tuple(256 << (2 * k) for k in range(10))  # 256 B .. 64 MiB, factor 4
REPEATS = 7
TARGET_BATCH_S = 0.02
QUANTILES = (0.25, 0.5, 0.75)
MIN_CALLS = 4  # timed calls per batch at least: a 64 MiB message then still gets 28 samples


def calibrate_host(sizes: tuple[int, ...] = MESSAGE_SIZES, repeats: int = REPEATS, timeout_s: float = 600.0
                   ) -> HostProfile:
    """Measure on two fresh Gloo ranks and return the host's primitives."""
    rows: dict[str, dict] = {}
    cfg = {"sizes": list(sizes), "repeats": repeats, "target_batch_s": TARGET_BATCH_S}
    run_ranks("real_backend.calibrate", cfg, 2, timeout_s, lambda d: rows.__setitem__(d.pop("kind") + str(
        d.get("nbytes", "")), d), what="calibration")
    p2p = [rows[f"p2p{n}"] for n in sizes]
    series = {key: [r[key] for r in p2p] for key in ("one_way_s", "reverse_s", "exchange_s")}
    series["copy_s"] = [rows["local"]["copy_s"][str(n)] for n in sizes]
    series["fresh_s"] = [rows["local"]["fresh_s"][str(n)] for n in sizes]
    for xs in series.values():  # nothing is faster on more bytes: a time above a larger size's
        for i in range(len(xs) - 2, -1, -1):  # is load from other processes, not the machine
            xs[i] = min(xs[i], xs[i + 1])
    spread = {k: max(r["spread"][k] for r in p2p) for k in ("one_way_s", "reverse_s", "exchange_s")}
    spread["call_s"] = rows["call"]["spread"]
    return HostProfile(
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        call_s=_call_cost(rows["call"], series["exchange_s"][0]), sizes=list(sizes), gamma=rows["local"]["gamma"], copy=rows["local"]["copy"],
        spread=spread, **series)


def _call_cost(call: dict, exchange: float) -> float:
    """The fixed cost of a call into ProcessGroupGloo that waits for messages: a barrier on
    two ranks (one dissemination round: each rank sends the other a zero-byte message and
    waits for the other's, i.e. two messages in flight) less that exchange's measured time.
    The call on a one-rank group (hand-off to the worker thread and back, no wait) is its
    floor. The wait costs more than the hand-off alone: the worker thread blocks, and its
    wake-up is one more thread switch than a p2p receive has."""
    return max(call["call_s"], call["barrier_s"] - exchange)


# --------------------------------------------------------------------------- worker side
def _worker(cfg: dict) -> None:  # pragma: no cover - runs in child processes
    die_with_parent()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, p = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), p, is_master=False,
                          timeout=datetime.timedelta(seconds=300))
    dist.init_process_group("gloo", rank=rank, world_size=p, store=store)
    own, _ = dist.new_subgroups(group_size=1)
    try:
        emit = (lambda d: print(json.dumps(d), flush=True)) if rank == 0 else (lambda d: None)
        other = 1 - rank
        x = torch.zeros(1)
        jobs = {("call", 0): (lambda: dist.all_reduce(x, group=own), 1), ("barrier", 0): (dist.barrier, 1)}
        for n in cfg["sizes"]:
            t, r = torch.zeros(max(1, n // 4)), torch.zeros(max(1, n // 4))
            jobs[("one_way_s", n)] = (_ping(t, rank, other, 0), 2)
            jobs[("reverse_s", n)] = (_ping(t, rank, other, 1), 2)
            jobs[("exchange_s", n)] = (_exchange(t, r, other), 1)
        got = _timed_passes(jobs, cfg)
        for n in cfg["sizes"]:
            row = {"kind": "p2p", "nbytes": n, "spread": {}}
            for key in ("one_way_s", "reverse_s", "exchange_s"):
                row[key], row["spread"][key] = got[(key, n)]
            emit(row)
        emit({"kind": "call", "call_s": got[("call", 0)][0], "spread": got[("call", 0)][1],
              "barrier_s": got[("barrier", 0)][0]})
        local = {"kind": "local", "gamma": _per_byte(lambda a, b: a.add_(b)), "copy": _per_byte(lambda a, b: a.copy_(b))}
        local["copy_s"], local["fresh_s"] = _copies(cfg["sizes"])
        emit(local)
    finally:
        dist.destroy_process_group()


def _ping(t, rank: int, other: int, starter: int):  # pragma: no cover - child side
    import torch.distributed as dist

    if rank == starter:
        return lambda: (dist.send(t, other), dist.recv(t, other))
    return lambda: (dist.recv(t, other), dist.send(t, other))


def _exchange(t, r, other: int):  # pragma: no cover - child side
    import torch.distributed as dist

    def fn():
        reqs = [dist.isend(t, other), dist.irecv(r, other)]
        for q in reqs:
            q.wait()

    return fn


def _timed_passes(jobs: dict, cfg: dict) -> dict:  # pragma: no cover - child side
    """key -> (25th percentile of single calls / messages per call, slowest rank; (p75 -
    p25) / median). Every job gets one batch of about `target_batch_s` per pass, passes
    `repeats` times over all jobs, so a burst of load from other processes hits one batch
    of many jobs rather than every batch of one. A low quantile of single calls is what
    repeats on a shared machine: other processes lengthen some calls, not all."""
    import numpy as np
    import torch
    import torch.distributed as dist

    iters = {}
    for key, (fn, _) in jobs.items():
        for _ in range(2):
            fn()
        t0 = time.perf_counter()
        for _ in range(3):
            fn()
        iters[key] = max(MIN_CALLS, math.ceil(cfg["target_batch_s"] / max((time.perf_counter() - t0) / 3, 1e-6)))
    agreed = torch.tensor([float(min(2000, v)) for v in iters.values()])
    dist.all_reduce(agreed, op=dist.ReduceOp.MAX)
    calls: dict = {key: [] for key in jobs}
    pc = time.perf_counter
    for _ in range(cfg["repeats"]):
        for (key, (fn, _)), k in zip(jobs.items(), agreed.tolist(), strict=True):
            dist.barrier()
            fn()  # untimed: the batch starts warm (buffer in cache, socket buffers grown), as back-to-back calls run
            last = pc()
            for _ in range(int(k)):
                fn()
                now = pc()
                calls[key].append(now - last)
                last = now
    q = torch.tensor([np.quantile(calls[key], QUANTILES, method="lower").tolist() for key in jobs], dtype=torch.float64)
    dist.all_reduce(q, op=dist.ReduceOp.MAX)
    out = {}
    for (key, (_, per)), (p25, p50, p75) in zip(jobs.items(), q.tolist(), strict=True):
        out[key] = (p25 / per, (p75 - p25) / p50 if p50 > 0 else 0.0)
    return out


def _copies(sizes: list[int], repeats: int = 7) -> tuple[dict, dict]:  # pragma: no cover - child side
    """Per size: median time of a copy into an existing float32 buffer, and into a new one."""
    import torch

    copy, fresh = {}, {}
    for n in sizes:
        src, dst = torch.ones(max(1, n // 4)), torch.empty(max(1, n // 4))
        dst.copy_(src)
        ts, tf = [], []
        for _ in range(repeats):
            t0 = time.perf_counter()
            dst.copy_(src)
            t1 = time.perf_counter()
            torch.empty(max(1, n // 4)).copy_(src)
            tf.append(time.perf_counter() - t1)
            ts.append(t1 - t0)
        copy[str(n)], fresh[str(n)] = statistics.median(ts), statistics.median(tf)
    return copy, fresh


def _per_byte(op, sizes=(1 << 16, 1 << 18, 1 << 20, 1 << 22), repeats: int = 21) -> float:  # pragma: no cover
    """Seconds per byte of `op(a, b)` on float32 tensors of 64 KiB-4 MiB (Gloo reduces
    segments of at most 1 MiB): the median over sizes of the 25th percentile per byte,
    robust to other processes taking the core for a while."""
    import numpy as np
    import torch

    per = []
    for nb in sizes:
        a, b = torch.zeros(nb // 4), torch.ones(nb // 4)
        op(a, b)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            op(a, b)
            ts.append(time.perf_counter() - t0)
        per.append(float(np.quantile(ts, 0.25)) / nb)
    return statistics.median(per)


if __name__ == "__main__":  # pragma: no cover
    worker_main(_worker, "real_backend.calibrate", "calibrate")
