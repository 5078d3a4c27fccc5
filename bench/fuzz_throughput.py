"""Fuzz throughput: schedules checked per second on an 8-rank, up-to-100-iteration DDP (3 buckets)
+ ZeroRedundancyOptimizer template under Join (a correct loop, so nothing stops the search early).

    python bench/fuzz_throughput.py [--budget 50] [--seed 0] [--profile] [--no-compress | --compress-only]

Prints schedules/s for the whole fuzz loop (hypothesis + simulate + check), with schedule
compression (the default, simdist/fuzz/compress.py) and with --no-compress, the ratio of
the two, how many schedules were compressed, and with --profile the functions where the
time goes. Target: >= 100 schedules/s.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import pstats
import time

from simdist.check.classify import check_run
from simdist.fuzz.runner import fuzz_template
from simdist.fuzz.template import Extreme, parse_template
from simdist.sim import simulate

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


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=50)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--profile", action="store_true", help="profile the fuzz loop and print the top functions")
    mode = ap.add_mutually_exclusive_group()
    mode.add_argument("--no-compress", action="store_true", help="only measure the fuzzer without schedule compression")
    mode.add_argument("--compress-only", action="store_true", help="only measure the fuzzer with schedule compression")
    args = ap.parse_args()
    t = parse_template(TEMPLATE, source="bench")

    # a single worst-case schedule (every rank at 100 inputs... rank-uneven: 100 vs 0)
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

    modes = [("compressed", True), ("--no-compress", False)]
    if args.no_compress:
        modes = modes[1:]
    elif args.compress_only:
        modes = modes[:1]
    rates: dict[str, float] = {}
    for label, compress in modes:
        prof = cProfile.Profile() if args.profile else None
        if prof:
            prof.enable()
        t0 = time.perf_counter()
        res = fuzz_template(t, budget=args.budget, seed=args.seed, out_dir=None, use_db=False, compress=compress)
        wall = time.perf_counter() - t0
        if prof:
            prof.disable()
        rates[label] = res.schedules / wall
        extra = ""
        if compress:
            extra = (f"; {res.compressed} compressed, {res.resimulated} re-simulated in full, iterations simulated "
                     f"{res.iterations_run} of {res.iterations_full} "
                     f"({res.iterations_full / max(res.iterations_run, 1):.1f}x fewer)")
        print(f"fuzz {label}: {res.schedules} schedules in {wall:.2f} s = {rates[label]:.1f} schedules/s "
              f"(target 100/s); failures: {len(res.failures)}{extra}")
        if prof:
            buf = io.StringIO()
            pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
            print(buf.getvalue())
    if len(rates) == 2:
        print(f"compression speed-up: {rates['compressed'] / rates['--no-compress']:.1f}x")

if __name__ == "__main__":
    main()
