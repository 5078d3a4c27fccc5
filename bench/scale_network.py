"""Benchmark (issue 14): the step-level network simulation and `simdist explain` at 1,024 ranks.

Targets: a ring all_reduce of 1 MiB on 1,024 ranks at step fidelity (schedule built and
simulated) in <= 0.5 s, equal to the closed form on a uniform topology; `simdist explain`
at 1,024 ranks <= 2 s end to end (a new process: imports included).

Prints, for each, the best of --repeat runs as CPU time (user + system of this process or
the child) and wall time, with the ratio to the target. On a shared machine the wall time
counts other processes' turns too: the CPU time is what the code costs, and the load
average is printed with it. For scale it also prints the event executor (the path for
schedules that reach links out of step order) at 128 ranks, where the former nested
simpy conditions took 21 s, and the baseline of `simdist explain` at 4 ranks (start-up).

    python bench/scale_network.py [--ranks 1024] [--repeat 3]
"""

from __future__ import annotations

import argparse
import os
import resource
import subprocess
import sys
import time
from pathlib import Path

from simdist.collectives import algorithms
from simdist.collectives.algorithms import REGISTRY
from simdist.network import CollectiveRequest, CostModel, preset_network
from simdist.network.simulate import simulate, simulate_events

SIM_TARGET_S = 0.5
EXPLAIN_TARGET_S = 2.0
NBYTES = 1 << 20


def _uniform(p: int) -> tuple[CostModel, float]:
    base = preset_network("loopback", p)
    alpha, beta = base.uniform_params()
    cm = CostModel.from_params(p, alpha, beta, base.gamma)
    return cm, REGISTRY[("all_reduce", "ring")].time(p, NBYTES, alpha, beta, base.gamma)


def simulate_ring(p: int, repeat: int) -> None:
    cm, closed = _uniform(p)
    best_cpu = best_wall = float("inf")
    res = None
    for _ in range(repeat):
        algorithms._built.cache_clear()  # make_schedule keeps recent schedules: build it inside the timing
        c0, w0 = time.process_time(), time.perf_counter()
        res = simulate(cm.network, [CollectiveRequest("all_reduce", NBYTES, list(range(p)), algo="ring")],
                       record=False)[0]
        best_cpu = min(best_cpu, time.process_time() - c0)
        best_wall = min(best_wall, time.perf_counter() - w0)
    assert res is not None
    rel = abs(res.duration - closed) / closed
    print(f"ring all_reduce 1 MiB on {p} ranks, step fidelity (schedule + replay): cpu {best_cpu:.3f} s, "
          f"wall {best_wall:.3f} s; target {SIM_TARGET_S} s: ratio {best_cpu / SIM_TARGET_S:.2f} (cpu), "
          f"{best_wall / SIM_TARGET_S:.2f} (wall)")
    print(f"  simulated {res.duration!r} s, closed form {closed!r} s, relative difference {rel:.1e} "
          f"({'equal' if rel < 1e-9 else 'DIFFERENT'})")


def events_at(p: int) -> None:
    cm, closed = _uniform(p)
    c0 = time.process_time()
    res = simulate_events(cm.network, [CollectiveRequest("all_reduce", NBYTES, list(range(p)), algo="ring")])[0]
    cpu = time.process_time() - c0
    n = len(res.transfers)
    print(f"event executor, same collective on {p} ranks: cpu {cpu:.3f} s for {n} messages "
          f"({cpu / n * 1e6:.1f} us per message; the former executor: 21 s at 128 ranks)")


def explain_end_to_end(p: int, repeat: int) -> tuple[float, float]:
    exe = Path(sys.executable).with_name("simdist")
    cmd = [str(exe), "explain", "all_reduce", "--algo", "ring", "--ranks", str(p), "--bytes", "1M"]
    best_cpu = best_wall = float("inf")
    for _ in range(repeat):
        before = resource.getrusage(resource.RUSAGE_CHILDREN)
        w0 = time.perf_counter()
        subprocess.run(cmd, check=True, stdout=subprocess.DEVNULL)
        wall = time.perf_counter() - w0
        after = resource.getrusage(resource.RUSAGE_CHILDREN)
        cpu = (after.ru_utime - before.ru_utime) + (after.ru_stime - before.ru_stime)
        best_cpu, best_wall = min(best_cpu, cpu), min(best_wall, wall)
    return best_cpu, best_wall


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("--ranks", type=int, default=1024)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"load average {os.getloadavg()[0]:.2f} on {os.cpu_count()} cores")
    simulate_ring(a.ranks, a.repeat)
    events_at(128)
    cpu, wall = explain_end_to_end(a.ranks, a.repeat)
    cpu4, wall4 = explain_end_to_end(4, a.repeat)
    print(f"simdist explain all_reduce --algo ring --ranks {a.ranks} --bytes 1M, end to end: cpu {cpu:.2f} s, "
          f"wall {wall:.2f} s; target {EXPLAIN_TARGET_S} s: ratio {cpu / EXPLAIN_TARGET_S:.2f} (cpu), "
          f"{wall / EXPLAIN_TARGET_S:.2f} (wall)")
    print(f"  baseline, same command at 4 ranks (start-up and imports): cpu {cpu4:.2f} s, wall {wall4:.2f} s; "
          f"{a.ranks} ranks cost {cpu - cpu4:+.2f} s cpu more")
    print(f"load average {os.getloadavg()[0]:.2f}")


if __name__ == "__main__":
    main()
