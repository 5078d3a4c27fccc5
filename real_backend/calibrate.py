"""Measure the primitives of the Gloo timing model on the real backend (`simdist calibrate`).

Usage from Python::

    from real_backend.calibrate import calibrate_host
    host = calibrate_host()          # a simdist.network.host.HostProfile

Two ranks (`real_backend.bench.run_ranks`: fresh processes, a loopback store, every
process ended however the run ends) measure, per message size: a ping-pong started by
rank 0 and one started by rank 1 (one message in flight, each direction; half a round
trip is one message), and an exchange (both ranks send to each other at once: two
messages in flight); then the fixed cost of one call into ProcessGroupGloo (`call_cost`:
a barrier on the two ranks less the exchange of the same block; at least an all_reduce on a
one-rank group), and on one core the seconds per byte of a float32 sum (Gloo's reduction)
and of a copy. Per quantity: `repeats` blocks, interleaved (one pass over all quantities,
then the next), each a batch of about 20 ms after a barrier and one untimed call (warm, as
the benchmark's back-to-back calls are), at least `MIN_CALLS` calls, every single call
timed (wall clock, and the CPU time of the whole process: every thread, Gloo's included); a
primitive is the slowest rank's 25th percentile of all its calls, and the profile
keeps, per primitive, how far its blocks' 25th percentiles disagree ((p75 - p25) / median,
`block_summary`), so a noisy calibration is visible. A message is never faster than a larger one, so a time above a
larger size's (load from other processes) is lowered to it. `cpu_s` keeps, at the
smallest size, the median CPU time per message (ping-pongs, exchange) and per call
(barrier, one-rank all_reduce) of the slowest rank: what a message and a call cost the
cores, which is what ranks outnumbering cores share (docs/timing.md, "Ranks outnumbering
cores"); the model does not use it yet.

Nothing here measures a collective: those are what the model predicts.
"""

from __future__ import annotations

import json
import math
import os
import statistics
import time

from real_backend.bench import join_gloo_world, run_ranks, worker_main
from simdist.network.host import HostProfile

GRID = tuple(256 << (2 * k) for k in range(10))  # 256 B .. 64 MiB, factor 4
# and 7/8 of each from 256 KiB: a message's cost per byte steps where its buffers outgrow a
# cache or a kernel limit, sizes that are powers of two; across a factor-4 span a linear
# interpolation spreads such a step over the whole span (2026-11-24: the one-way time rose
# 40-50% between 896 KiB and 1 MiB in three calibrations, and 741 KiB was priced as if the
# step were half taken). A point just below puts the step in the span's last eighth.
MESSAGE_SIZES = tuple(sorted(GRID + tuple(n * 7 // 8 for n in GRID if n >= 1 << 18)))
REPEATS = 7
TARGET_BATCH_S = 0.02
QUANTILE = 0.25  # of a block's single calls
MAX_RING = 8  # ranks at most in the ring-step measurement (`ring_worlds`)
MIN_CALLS = 4  # timed calls per batch at least: a 64 MiB message then still gets 28 samples


def calibrate_host(sizes: tuple[int, ...] = MESSAGE_SIZES, repeats: int = REPEATS, timeout_s: float = 600.0
                   ) -> HostProfile:
    """Measure on two fresh Gloo ranks and return the host's primitives."""
    rows: dict[str, dict] = {}
    cfg = {"sizes": list(sizes), "repeats": repeats, "target_batch_s": TARGET_BATCH_S}
    def keep(d: dict) -> None:
        rows[d.pop("kind") + str(d.get("nbytes", d.get("p", "")))] = d

    run_ranks("real_backend.calibrate", cfg, 2, timeout_s, keep, what="calibration")
    for p in ring_worlds(_cores()):  # more ranks than cores: the ring step that shows them taking turns
        run_ranks("real_backend.calibrate", {**cfg, "ring": True}, p, timeout_s, keep, what="calibration")
    return host_from_blocks(rows, list(sizes))


def ring_worlds(cores: int) -> list[int]:
    """World sizes whose p2p ring step the calibration measures: more ranks than cores, up
    to two per core (at most `MAX_RING` ranks): where ranks take turns on the cores."""
    return list(range(cores + 1, min(2 * cores, MAX_RING) + 1))


def _cores() -> int:
    return len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)


def host_from_blocks(rows: dict[str, dict], sizes: list[int]) -> HostProfile:
    """The profile from the workers' rows (`_timed_passes`: per quantity the 25th percentile
    of all its single calls, and of each block's). A primitive is the former, the statistic
    the benchmark judges collectives by; the blocks give its spread (`block_summary`), so a
    calibration whose blocks disagree is visible, and the call cost is paired block by
    block (`call_cost`)."""
    p2p = [rows[f"p2p{n}"] for n in sizes]
    keys = ("one_way_s", "reverse_s", "exchange_s")
    series = {key: [r[key]["all"] for r in p2p] for key in keys}
    series["copy_s"] = [rows["local"]["copy_s"][str(n)] for n in sizes]
    series["fresh_s"] = [rows["local"]["fresh_s"][str(n)] for n in sizes]
    for xs in series.values():  # nothing is faster on more bytes: a time above a larger size's
        for i in range(len(xs) - 2, -1, -1):  # is load from other processes, not the machine
            xs[i] = min(xs[i], xs[i + 1])
    spread = {key: max(block_summary(r[key]["blocks"])[1] for r in p2p) for key in keys}
    call = rows["call"]
    call_s, spread["call_s"] = call_cost(call["barrier_s"]["blocks"], p2p[0]["exchange_s"]["blocks"],
                                         call["call_s"]["blocks"])
    cpu = {key: p2p[0][key]["cpu"] for key in keys if "cpu" in p2p[0][key]}
    cpu.update({key: call[key]["cpu"] for key in ("barrier_s", "call_s") if "cpu" in call[key]})
    rings = {k[len("ring"):]: r["ring_s"] for k, r in rows.items() if k.startswith("ring")}
    cpu.update({f"ring_s/{p}": r["cpu"] for p, r in rings.items() if "cpu" in r})
    if rings:  # it prices the Gloo model's turns (`gloo_time.turn_time`): its noise is shown like the rest
        spread["ring_s"] = max(block_summary(r["blocks"])[1] for r in rings.values())
    return HostProfile(
        cores=_cores(), call_s=call_s, sizes=list(sizes), gamma=rows["local"]["gamma"], copy=rows["local"]["copy"],
        spread=spread, cpu_s=cpu, ring_s={p: r["all"] for p, r in rings.items()}, **series)


def block_summary(blocks: list[float]) -> tuple[float, float]:
    """(median over blocks, (p75 - p25) / median over blocks). A block is one batch of the
    quantity in one pass over all quantities: a burst of load from other processes spoils a
    block, not the median, and the blocks' disagreement is the calibration's own spread."""
    if len(blocks) == 1:
        return blocks[0], 0.0
    q25, q50, q75 = statistics.quantiles(blocks, n=4, method="inclusive")
    return q50, (q75 - q25) / q50 if q50 > 0 else 0.0


def call_cost(barrier: list[float], exchange: list[float], floor: list[float]) -> tuple[float, float]:
    """The fixed cost of a call into ProcessGroupGloo that waits for messages, and its block
    spread. Per block: a barrier on two ranks (ProcessGroupGloo's worker-thread path: work
    created and queued, the worker woken, one dissemination round in which each rank sends
    the other a zero-byte message and waits for the other's, the caller woken) less the p2p
    exchange of the smallest messages in the same block (two in flight through the caller's
    own thread); at least that block's all_reduce on a one-rank group (the hand-off to the
    worker thread and back, no message). Paired per block, so a slow stretch that slows
    both terms cancels; then the median over blocks."""
    return block_summary([max(f, b - e) for b, e, f in zip(barrier, exchange, floor, strict=True)])


# --------------------------------------------------------------------------- worker side
def _worker(cfg: dict) -> None:  # pragma: no cover - runs in child processes
    import torch
    import torch.distributed as dist

    rank, p = join_gloo_world()
    if cfg.get("ring"):
        return _ring_worker(cfg, rank, p)
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
        for n in cfg["sizes"]:  # per quantity its value in each block (`host_from_blocks` combines)
            emit({"kind": "p2p", "nbytes": n, **{key: got[(key, n)] for key in ("one_way_s", "reverse_s", "exchange_s")}})
        emit({"kind": "call", "call_s": got[("call", 0)], "barrier_s": got[("barrier", 0)]})
        local = {"kind": "local", "gamma": _per_byte(lambda a, b: a.add_(b)), "copy": _per_byte(lambda a, b: a.copy_(b))}
        local["copy_s"], local["fresh_s"] = _copies(cfg["sizes"])
        emit(local)
    finally:
        dist.destroy_process_group()


def _ring_worker(cfg: dict, rank: int, p: int) -> None:  # pragma: no cover - runs in child processes
    """One step of a ring on p ranks, back to back: each rank sends the smallest message to the
    next and receives one from the previous (p messages at once, as in every step of Gloo's
    rings). With p above the cores the ranks take turns; this is the p2p primitive that
    shows it (docs/timing.md, third session)."""
    import torch
    import torch.distributed as dist

    try:
        t, r = torch.zeros(max(1, cfg["sizes"][0] // 4)), torch.zeros(max(1, cfg["sizes"][0] // 4))

        def step():
            reqs = [dist.isend(t, (rank + 1) % p), dist.irecv(r, (rank - 1) % p)]
            for q in reqs:
                q.wait()

        got = _timed_passes({("ring_s", p): (step, 1)}, cfg)
        if rank == 0:
            print(json.dumps({"kind": "ring", "p": p, "ring_s": got[("ring_s", p)]}), flush=True)
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
    """key -> {"blocks": the 25th percentile of each block's single calls, "all": of all its
    calls}, per message (a ping-pong call is two), slowest rank. Every job gets one batch (a
    block) of about `target_batch_s` per pass, and the passes go `repeats` times over all
    jobs, interleaved, so a burst of load from other processes hits one block of many jobs
    rather than every block of one. A low quantile of single calls is what repeats on a
    shared machine (other processes lengthen some calls, not all) and what the benchmark
    judges collectives by; the blocks' values give the spread (`block_summary`) and pair
    the barrier with its exchange (`call_cost`)."""
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
    blocks = torch.zeros(len(jobs), cfg["repeats"] + 2, dtype=torch.float64)  # then all blocks, then CPU
    calls: dict = {key: [] for key in jobs}
    cpus: dict = {key: [] for key in jobs}
    pc, cpu = time.perf_counter, time.process_time
    for b in range(cfg["repeats"]):
        for j, ((key, (fn, per)), k) in enumerate(zip(jobs.items(), agreed.tolist(), strict=True)):
            dist.barrier()
            fn()  # untimed: the block starts warm (buffer in cache, socket buffers grown), as back-to-back calls run
            block, last, last_cpu = [], pc(), cpu()
            for _ in range(int(k)):
                fn()
                now, now_cpu = pc(), cpu()
                block.append((now - last) / per)
                cpus[key].append((now_cpu - last_cpu) / per)
                last, last_cpu = now, now_cpu
            blocks[j, b] = float(np.quantile(block, QUANTILE, method="lower"))
            calls[key] += block
    for j, key in enumerate(jobs):
        blocks[j, -2] = float(np.quantile(calls[key], QUANTILE, method="lower"))
        blocks[j, -1] = float(np.median(cpus[key]))
    dist.all_reduce(blocks, op=dist.ReduceOp.MAX)  # the slowest rank, block by block
    return {key: {"blocks": row[:-2], "all": row[-2], "cpu": row[-1]} for key, row in zip(jobs, blocks.tolist(),
                                                                                         strict=True)}


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
