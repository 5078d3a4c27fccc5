"""Benchmark: a real-backend run with launched workers against one with workers forked by a
zygote (`real_backend.workers.WorkerZygote`), per run, in the same process and alternately.

For each scenario, `--repeat` pairs of runs (plain launch, then forked); per run the wall time
and the CPU seconds of everything the run used: this launcher's own, and its workers' (a
launched worker is our child; a forked one is the zygote's, whose reaped children's time
`/proc/<zygote>/stat` adds up). CPU seconds are what a loaded machine does not change; wall
time shows what a user waits. The zygote's own start (importing torch once) is printed
apart: it is paid once per zygote, however many runs it serves.

    python bench/real_launch.py [--repeat 2] [SCENARIO.toml ...]
"""

from __future__ import annotations

import argparse
import os
import resource
import statistics
import sys
import time
from pathlib import Path

from real_backend.launch import run_real
from real_backend.workers import WorkerZygote
from simdist.scenario import load_scenario

ROOT = Path(__file__).resolve().parent.parent
DEFAULT = ["counter_tutorial.toml", "ddp_join_uneven.toml", "no_join_hang.toml", "forward_collective_throw.toml"]
TICK = os.sysconf("SC_CLK_TCK")


def _own_cpu() -> float:
    """CPU seconds of this process and its reaped children."""
    me, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return me.ru_utime + me.ru_stime + kids.ru_utime + kids.ru_stime


def _proc_cpu(pid: int) -> tuple[float, float]:
    """(the process's own CPU seconds, its reaped children's), from /proc/<pid>/stat."""
    fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
    utime, stime, cutime, cstime = (int(x) for x in fields[11:15])
    return (utime + stime) / TICK, (cutime + cstime) / TICK


def _run(s, zygote: WorkerZygote | None) -> tuple[float, float, str]:
    """(wall s, CPU s, outcome) of one run."""
    before_z = _proc_cpu(zygote.pid)[1] if zygote is not None else 0.0
    c0, t0 = _own_cpu(), time.monotonic()
    report = run_real(s, zygote=zygote)
    wall = time.monotonic() - t0
    cpu = _own_cpu() - c0 + ((_proc_cpu(zygote.pid)[1] - before_z) if zygote is not None else 0.0)
    return wall, cpu, report.outcome


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("scenarios", nargs="*", help=f"scenario files (default: {', '.join(DEFAULT)} from scenarios/)")
    ap.add_argument("--repeat", type=int, default=2)
    args = ap.parse_args()
    paths = [Path(p) for p in args.scenarios] or [ROOT / "scenarios" / n for n in DEFAULT]
    t0 = time.monotonic()
    zygote = WorkerZygote()
    start_wall = time.monotonic() - t0
    start_cpu = sum(_proc_cpu(zygote.pid))
    print(f"zygote start: wall {start_wall:.2f} s, CPU {start_cpu:.2f} s (once)")
    print(f"{'scenario':32} {'ranks':>5} {'how':7} {'wall s':>7} {'CPU s':>7}  outcome")
    totals: dict[str, list[tuple[float, float]]] = {"plain": [], "forked": []}
    try:
        for path in paths:
            s = load_scenario(path, target="real")
            for _ in range(args.repeat):
                for how, z in (("plain", None), ("forked", zygote)):
                    wall, cpu, outcome = _run(s, z)
                    totals[how].append((wall, cpu))
                    print(f"{path.stem:32} {s.world_size:>5} {how:7} {wall:7.2f} {cpu:7.2f}  {outcome}", flush=True)
    finally:
        zygote.close()
    (pw, pc), (fw, fc) = ([statistics.mean(x) for x in zip(*totals[h], strict=True)] for h in ("plain", "forked"))
    print(f"mean per run: plain wall {pw:.2f} s CPU {pc:.2f} s; forked wall {fw:.2f} s CPU {fc:.2f} s; "
          f"forked/plain: wall {fw / pw:.2f}, CPU {fc / pc:.2f}")
    saved = pc - fc
    if saved > 0:
        print(f"the zygote's start pays for itself after {start_cpu / saved:.1f} runs (CPU)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
