"""Benchmark (issue #3): simulate 8 ranks x 1,000 iterations of DDP (3 buckets) + ZeRO under Join.

Target: under 2 seconds on the CI machine (2 cores). Prints the wall time, the number of
collectives simulated and the rate, plus the ratio to the target.

    python bench/sim_speed.py [--iterations 1000] [--ranks 8] [--repeat 3]
"""

from __future__ import annotations

import argparse
import time

from simdist.sim import simulate
from simdist.testing.workloads import ddp_zero_join

TARGET_S = 2.0


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--iterations", type=int, default=1000)
    ap.add_argument("--ranks", type=int, default=8)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    s = ddp_zero_join(a.ranks, a.iterations)
    best = float("inf")
    rep = None
    for _ in range(a.repeat):
        t0 = time.perf_counter()
        rep = simulate(s)
        best = min(best, time.perf_counter() - t0)
    assert rep is not None
    n = sum(len(r.trace) for r in rep.ranks)
    buckets = {e.numel for e in rep.ranks[0].trace if e.origin == "ddp.backward.bucket_allreduce"}
    print(f"outcome={rep.outcome} ranks={a.ranks} iterations={a.iterations} bucket sizes={sorted(buckets)}")
    print(f"best of {a.repeat}: {best:.3f} s for {n} per-rank collectives ({n / best:,.0f}/s)")
    print(f"target {TARGET_S:.1f} s: {'met' if best < TARGET_S else 'MISSED'} (ratio {best / TARGET_S:.2f} of target)")


if __name__ == "__main__":
    main()
