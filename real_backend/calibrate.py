"""Measure the primitives of the Gloo timing model on the real backend (`simdist calibrate`).

Usage from Python::

    from real_backend.calibrate import calibrate_host
    host = calibrate_host()          # a simdist.network.host.HostProfile

Two ranks (`real_backend.bench.run_ranks`: fresh processes, a loopback store, every
process ended however the run ends) measure, per message size: a ping-pong started by
rank 0 and one started by rank 1 (one message in flight, each direction; half a round
trip is one message), and an exchange (both ranks send to each other at once: two
messages in flight); then the fixed cost of one call into ProcessGroupGloo that moves no
message (all_reduce on a one-rank group), and on one core the seconds per byte of a
float32 sum (Gloo's reduction) and of a copy. Per quantity: batches of about 20 ms after
a barrier, every single call timed, the slowest rank's 25th percentile, and the spread
(p75 - p25) / median kept so a noisy calibration is visible.

Nothing here measures a collective: those are what the model predicts.
"""

from __future__ import annotations

import datetime
import json
import math
import os
import statistics
import sys
import time

from real_backend.bench import run_ranks
from simdist.network.host import HostProfile
from simdist.procs import die_with_parent

MESSAGE_SIZES = tuple(256 << (2 * k) for k in range(10))  # 256 B .. 64 MiB, factor 4
REPEATS = 7
TARGET_BATCH_S = 0.02
QUANTILES = (0.25, 0.5, 0.75)


def calibrate_host(sizes: tuple[int, ...] = MESSAGE_SIZES, repeats: int = REPEATS, timeout_s: float = 600.0
                   ) -> HostProfile:
    """Measure on two fresh Gloo ranks and return the host's primitives."""
    rows: dict[str, dict] = {}
    cfg = {"sizes": list(sizes), "repeats": repeats, "target_batch_s": TARGET_BATCH_S}
    run_ranks("real_backend.calibrate", cfg, 2, timeout_s, lambda d: rows.__setitem__(d.pop("kind") + str(
        d.get("nbytes", "")), d), what="calibration")
    p2p = [rows[f"p2p{n}"] for n in sizes]
    spread = {k: max(r["spread"][k] for r in p2p) for k in ("one_way_s", "reverse_s", "exchange_s")}
    spread["call_s"] = rows["call"]["spread"]
    return HostProfile(
        cores=len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1),
        call_s=rows["call"]["call_s"], sizes=list(sizes), one_way_s=[r["one_way_s"] for r in p2p],
        reverse_s=[r["reverse_s"] for r in p2p], exchange_s=[r["exchange_s"] for r in p2p],
        gamma=rows["local"]["gamma"], copy=rows["local"]["copy"], spread=spread)


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
        for n in cfg["sizes"]:
            t, r = torch.zeros(max(1, n // 4)), torch.zeros(max(1, n // 4))
            row = {"kind": "p2p", "nbytes": n, "spread": {}}
            for key, fn, per in (("one_way_s", _ping(t, rank, other, 0), 2), ("reverse_s", _ping(t, rank, other, 1), 2),
                                 ("exchange_s", _exchange(t, r, other), 1)):
                med, spr = _timed(fn, cfg)
                row[key] = med / per
                row["spread"][key] = spr
            emit(row)
        x = torch.zeros(1)
        med, spr = _timed(lambda: dist.all_reduce(x, group=own), cfg)
        emit({"kind": "call", "call_s": med, "spread": spr})
        emit({"kind": "local", "gamma": _per_byte(lambda a, b: a.add_(b)), "copy": _per_byte(lambda a, b: a.copy_(b))})
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


def _timed(fn, cfg: dict) -> tuple[float, float]:  # pragma: no cover - child side
    """(25th percentile of single calls, slowest rank; (p75 - p25) / median). A low
    quantile of single calls is what repeats on a shared machine: other processes
    lengthen some calls, not all (docs/timing.md); the benchmark judges with the same."""
    import numpy as np
    import torch
    import torch.distributed as dist

    for _ in range(3):
        fn()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    est = max((time.perf_counter() - t0) / 3, 1e-6)
    it = torch.tensor([float(min(2000, max(2, math.ceil(cfg["target_batch_s"] / est))))])
    dist.all_reduce(it, op=dist.ReduceOp.MAX)
    iters = int(it.item())
    calls = []
    pc = time.perf_counter
    for _ in range(cfg["repeats"]):
        dist.barrier()
        last = pc()
        for _ in range(iters):
            fn()
            now = pc()
            calls.append(now - last)
            last = now
    q = torch.tensor(np.quantile(calls, QUANTILES, method="lower").tolist(), dtype=torch.float64)
    dist.all_reduce(q, op=dist.ReduceOp.MAX)
    p25, p50, p75 = q.tolist()
    return p25, (p75 - p25) / p50 if p50 > 0 else 0.0


def _per_byte(op, sizes=(1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24), repeats: int = 7) -> float:  # pragma: no cover
    """Seconds per byte of `op(a, b)` on float32 tensors: slope of the best times over sizes."""
    import numpy as np
    import torch

    best = []
    for nb in sizes:
        a, b = torch.zeros(nb // 4), torch.ones(nb // 4)
        op(a, b)
        ts = []
        for _ in range(repeats):
            t0 = time.perf_counter()
            op(a, b)
            ts.append(time.perf_counter() - t0)
        best.append(statistics.median(ts))
    return float(np.polyfit(np.array(sizes, dtype=float), np.array(best), 1)[0])


if __name__ == "__main__":  # pragma: no cover
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        _worker(json.loads(sys.argv[2]))
    else:
        print("usage: python -m real_backend.calibrate --worker CONFIG (internal); use `simdist calibrate`")
        sys.exit(2)
