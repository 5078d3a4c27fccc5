"""Benchmark (issue 14): the Join/DDP simulator as ranks grow.

DDP (3 buckets) + ZeRO under Join, 20 iterations with uneven inputs (`simdist.testing.workloads.ddp_zero_join`,
as bench/sim_speed.py). Targets: rank-collectives simulated per second at 1,024 ranks at
least half the rate at 8 ranks; peak memory of a 1,024-rank run <= 2 GB.

Rates are CPU time (this process), best of --repeat, measured in the same run for every
size, so the ratio compares like with like on a shared machine; the load average is
printed. Peak memory is the maximum resident size of a fresh process that imports
simdist and simulates the 1,024-rank run (imports included).

    python bench/scale_ddp.py [--ranks 8,64,256,1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from simdist.sim import simulate
from simdist.testing.workloads import ddp_zero_join

ITERATIONS = 20
MEMORY_TARGET_MB = 2048
RATIO_TARGET = 0.5

_CHILD = """
import resource
from simdist.sim import simulate
from simdist.testing.workloads import ddp_zero_join
rep = simulate(ddp_zero_join({p}, {it}))
print(sum(len(r.trace) for r in rep.ranks), resource.getrusage(resource.RUSAGE_SELF).ru_maxrss)
"""


def rate(p: int, repeat: int) -> tuple[float, int, str]:
    """(rank-collectives per CPU second, how many, outcome), best of `repeat`."""
    s = ddp_zero_join(p, ITERATIONS)
    best, n, outcome = float("inf"), 0, ""
    for _ in range(repeat):
        c0 = time.process_time()
        rep = simulate(s)
        best = min(best, time.process_time() - c0)
        n, outcome = sum(len(r.trace) for r in rep.ranks), rep.outcome
        del rep
    return n / best, n, outcome


def peak_memory_mb(p: int) -> tuple[float, int]:
    code = _CHILD.format(p=p, it=ITERATIONS)
    out = subprocess.run([sys.executable, "-c", code], check=True, capture_output=True, text=True).stdout.split()
    return int(out[1]) / 1024, int(out[0])  # ru_maxrss is in KiB on Linux


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", default="8,64,256,1024")
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    sizes = [int(x) for x in a.ranks.split(",")]
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores; DDP + ZeRO + Join, {ITERATIONS} iterations")
    rates = {}
    for p in sizes:
        r, n, outcome = rate(p, a.repeat if p > 8 else 3 * a.repeat)
        rates[p] = r
        print(f"  {p:5d} ranks: {n:7d} rank-collectives, {r:9,.0f} per cpu second ({outcome})", flush=True)
    lo, hi = min(sizes), max(sizes)
    ratio = rates[hi] / rates[lo]
    print(f"rate at {hi} ranks / rate at {lo} ranks = {ratio:.2f}; target >= {RATIO_TARGET}: "
          f"{'met' if ratio >= RATIO_TARGET else 'MISSED'} ({ratio / RATIO_TARGET:.2f} of the target)")
    mb, n = peak_memory_mb(hi)
    print(f"peak memory, {hi} ranks ({n} rank-collectives), fresh process: {mb:.0f} MB; target {MEMORY_TARGET_MB} MB: "
          f"{'met' if mb <= MEMORY_TARGET_MB else 'MISSED'} (ratio {mb / MEMORY_TARGET_MB:.2f} of the target)")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
