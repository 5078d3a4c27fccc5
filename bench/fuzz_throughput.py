"""Fuzz throughput: schedules checked per second on an 8-rank, up-to-100-iteration DDP (3 buckets)
+ ZeroRedundancyOptimizer template under Join (a correct loop, so nothing stops the search early),
on one core (--jobs 1) and on two worker processes (--jobs 2), measured in the same run.

    python bench/fuzz_throughput.py [--budget 1000] [--seed 0] [--reps 2] [--jobs 2] [--profile] [--no-compress]

Targets (issue 14): >= 500 schedules/s on one core; --jobs 2 >= 1.7x of --jobs 1 on a
2-core machine. Both runs search the same shards (same seed, same answer), so the ratio is
the parallel speed-up alone. The runs alternate (1, N, 1, N, ...) and the best of each is
kept, and the load average is printed: on a shared machine, compare the ratio, not the
absolute rates, and only between runs under the same load. The one-core rate is given in
wall-clock time and in CPU time of this process (less sensitive to other processes).
--profile prints where one --jobs 1 run spends its time; --no-compress adds a run with
schedule compression off (simdist/fuzz/compress.py) for comparison.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import os
import pstats
import time

from simdist.check.classify import check_run
from simdist.fuzz.runner import fuzz_template
from simdist.fuzz.template import Extreme, parse_template
from simdist.sim import simulate

TARGET_RATE = 500.0  # schedules/s on one core
TARGET_SPEEDUP = 1.7  # --jobs 2 over --jobs 1
TEMPLATE = {
    "name": "bench_ddp_zero_8rank",
    "world_size": 8,
    "on_finish": "stay",
    "inputs": {"counts": {"each": {"range": [0, 100]}}},
    # three 1.2 MB float32 parameters with a 1 MiB bucket cap: one bucket each after the rebuild
    "model": {"params": [300_000, 300_000, 300_000], "bucket_cap_mb": 1.0},
    "optimizer": {"kind": "adam", "zero": True},
    "join": {"joinables": ["ddp", "zero"]},
    "loop": [{"kind": "forward"}, {"kind": "backward"}, {"kind": "optimizer_step"}],
    "fuzz": {"expect": "ok"},
}


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def _one(t, budget: int, seed: int, jobs: int, compress: bool = True, profile: cProfile.Profile | None = None):
    """(result, wall seconds, CPU seconds of this process) for one fuzz run."""
    w0, c0 = time.perf_counter(), time.process_time()
    if profile is not None:
        profile.enable()
    res = fuzz_template(t, budget=budget, seed=seed, out_dir=None, use_db=False, compress=compress, jobs=jobs)
    if profile is not None:
        profile.disable()
    return res, time.perf_counter() - w0, time.process_time() - c0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=1000, help="examples per run (10 shards of 100 by default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2, help="runs of each --jobs value (the best is kept)")
    ap.add_argument("--jobs", type=int, default=2, help="the parallel run's worker processes")
    ap.add_argument("--profile", action="store_true", help="profile one --jobs 1 run and print the top functions")
    ap.add_argument("--no-compress", action="store_true", help="also measure --jobs 1 without schedule compression")
    args = ap.parse_args()
    t = parse_template(TEMPLATE, source="bench")

    # a single worst-case schedule (every rank at 100 inputs)
    s = t.scenario(Extreme(True))
    t0 = time.perf_counter()
    rep = simulate(s)
    t_sim = time.perf_counter() - t0
    t0 = time.perf_counter()
    check_run(rep, s)
    t_chk = time.perf_counter() - t0
    n_coll = sum(len(r.trace) for r in rep.ranks)
    print(f"one schedule, 8 ranks x 100 inputs: simulate {t_sim * 1e3:.1f} ms ({n_coll} rank-collectives, "
          f"{t_sim / max(n_coll, 1) * 1e6:.1f} us each), check {t_chk * 1e3:.1f} ms")
    print(f"before: {_load()}")

    best: dict[int, tuple] = {}
    for _ in range(args.reps):
        for jobs in (1, args.jobs):
            res, wall, cpu = _one(t, args.budget, args.seed, jobs)
            if jobs not in best or wall < best[jobs][1]:
                best[jobs] = (res, wall, cpu)
    r1, w1, c1 = best[1]
    rn, wn, _ = best[args.jobs]
    assert (r1.schedules, r1.failures) == (rn.schedules, rn.failures), "the parallel run searched something else"
    rate1, rate1_cpu, rate_n = r1.schedules / w1, r1.schedules / c1, rn.schedules / wn
    print(f"after:  {_load()}")
    print(f"template: 8 ranks, inputs 0-100 per rank, DDP (3 buckets) + ZeRO under Join; budget {args.budget} "
          f"({r1.shards} shards), seed {args.seed}, {r1.schedules} distinct schedules, failures: {len(r1.failures)}; "
          f"{r1.compressed} compressed, iterations simulated {r1.iterations_run} of {r1.iterations_full} "
          f"({r1.iterations_full / max(r1.iterations_run, 1):.1f}x fewer)")
    print(f"--jobs 1: {rate1:.1f} schedules/s wall ({w1:.2f} s), {rate1_cpu:.1f} schedules/s CPU time "
          f"-> {rate1 / TARGET_RATE:.2f}x of the {TARGET_RATE:.0f}/s target (CPU time: {rate1_cpu / TARGET_RATE:.2f}x)")
    print(f"--jobs {args.jobs}: {rate_n:.1f} schedules/s wall ({wn:.2f} s) -> speed-up {rate_n / rate1:.2f}x over --jobs 1 "
          f"({rate_n / rate1 / TARGET_SPEEDUP:.2f}x of the {TARGET_SPEEDUP}x target)")

    if args.no_compress:
        res, wall, _ = _one(t, args.budget, args.seed, 1, compress=False)
        print(f"--jobs 1 --no-compress: {res.schedules / wall:.1f} schedules/s wall -> compression speed-up "
              f"{rate1 / (res.schedules / wall):.1f}x")
    if args.profile:
        prof = cProfile.Profile(time.process_time)
        _one(t, args.budget, args.seed, 1, profile=prof)
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        print(buf.getvalue())


if __name__ == "__main__":
    main()
