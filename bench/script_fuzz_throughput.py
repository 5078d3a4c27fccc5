"""Script fuzz throughput: schedules per second of `simdist fuzz SCRIPT.py --nproc-per-node-range 2:4`
on the two DataLoader DDP examples (no Join: finds the hang and shrinks it; under Join: nothing to
find, every schedule runs to its end), in CPU time and wall time, and the ratio to a baseline.

    python bench/script_fuzz_throughput.py [--budget 30] [--seed 0] [--reps 2] [--baseline DIR]

Every measurement is a fresh process (this file with --one) that first starts and closes a fork
server for the script alone (the CPU of its start-up: importing torch, once per search), then
runs one search (`simdist.fuzz.scripts.fuzz_script`, which starts its own; the wall time of
that start-up: until the search's first progress call). Runs alternate (this code,
then the code in DIR, e.g. `git archive main | tar -x -C DIR`, imported through PYTHONPATH,
script by script, --reps times) and the best of each is kept, so both see the same load.

Figures per script and code:
* CPU: schedules / CPU seconds of the search's process and all its children (the fork server
  and every rank it forked), the fork server's start-up taken out. The figure to compare on a
  shared machine;
* wall: schedules / wall seconds, start-up taken out; and the whole search's wall time with it
  (what a user waits for). On a loaded machine wall time is mostly the load.
With --baseline: the ratio this / baseline of each, and a check that both found the same
(failure classes, shrunk schedules, schedules run): a faster search must not search otherwise.
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
SCRIPTS = ("examples/fuzz_ddp_dataloader_no_join.py", "examples/fuzz_ddp_dataloader_join.py")
WORLDS = (2, 4)


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def _cpu() -> float:
    return time.process_time() + _children_cpu()


def measure_one(script: str, budget: int, seed: int) -> dict[str, Any]:
    """In a fresh process: the fork server's start-up alone, then one search."""
    import simdist
    from simdist.fuzz.scripts import Space, fuzz_script
    from simdist.script.zygote import Zygote

    c0 = _cpu()
    Zygote(script, gpus=max(8, WORLDS[1]), stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL).close()
    start_cpu = _cpu() - c0
    first: list[float] = []  # the search's first progress call: its fork server has started
    w0, c0 = time.perf_counter(), _cpu()
    res = fuzz_script(Space(script, (), WORLDS), budget=budget, seed=seed, out_dir=None,
                      on_example=lambda *_: first or first.append(time.perf_counter()))
    wall, cpu = time.perf_counter() - w0, _cpu() - c0
    start_wall = first[0] - w0
    return {"code": str(Path(simdist.__file__).parent.parent), "schedules": res.schedules, "examples": res.examples,
            "wall": wall, "cpu": cpu, "start_wall": start_wall, "start_cpu": start_cpu,
            "found": sorted((c.key, c.world_size, tuple(c.caps)) for c in res.counterexamples),
            "baseline_failed": res.baseline_failed}


def _spawn(script: str, budget: int, seed: int, code: str | None) -> dict[str, Any]:
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = os.pathsep.join([str(Path(code).resolve()), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    out = subprocess.run([sys.executable, __file__, "--one", script, "--budget", str(budget), "--seed", str(seed)],
                         cwd=ROOT, env=env, capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def _rates(r: dict[str, Any]) -> tuple[float, float]:
    """(schedules per CPU second, per wall second), the fork server's start-up taken out."""
    n = r["schedules"]
    return n / max(r["cpu"] - r["start_cpu"], 1e-9), n / max(r["wall"] - r["start_wall"], 1e-9)


def _line(label: str, r: dict[str, Any]) -> str:
    cpu, wall = _rates(r)
    return (f"  {label:<9} {r['schedules']:4d} schedules: {cpu:5.2f}/s CPU ({(r['cpu'] - r['start_cpu']) / r['schedules'] * 1e3:5.0f} "
            f"ms a schedule), {wall:5.2f}/s wall; whole search {r['wall']:6.1f} s wall with the fork server's start-up "
            f"({r['start_wall']:.1f} s wall, {r['start_cpu']:.1f} s CPU)")


def _load() -> str:
    return "load average " + " ".join(f"{x:.2f}" for x in os.getloadavg()) + f" on {os.cpu_count()} cores"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=30, help="hypothesis examples per search")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2, help="runs of each script and code (the best is kept)")
    ap.add_argument("--baseline", metavar="DIR", help="also measure the simdist in DIR (alternating with this one)")
    ap.add_argument("--one", metavar="SCRIPT", help=argparse.SUPPRESS)  # a measurement process
    args = ap.parse_args()
    if args.one:
        print(json.dumps(measure_one(args.one, args.budget, args.seed)))
        return
    codes = {"this": None} | ({"baseline": args.baseline} if args.baseline else {})
    print(f"simdist fuzz SCRIPT --nproc-per-node-range {WORLDS[0]}:{WORLDS[1]} --budget {args.budget} --seed {args.seed}; "
          f"best of {args.reps}; {_load()}")
    runs: dict[tuple[str, str], list[dict[str, Any]]] = {}
    for _ in range(args.reps):
        for script in SCRIPTS:
            for label, code in codes.items():
                runs.setdefault((script, label), []).append(_spawn(script, args.budget, args.seed, code))
    print(f"after: {_load()}")
    same = True
    for script in SCRIPTS:
        print(script)
        best = {label: min(runs[(script, label)], key=lambda r: r["cpu"] - r["start_cpu"]) for label in codes}
        for label in codes:
            print(_line(label, best[label]))
        if args.baseline:
            (a_cpu, a_wall), (b_cpu, b_wall) = _rates(best["this"]), _rates(best["baseline"])
            a_whole, b_whole = best["this"]["wall"], best["baseline"]["wall"]
            print(f"  this / baseline: {a_cpu / b_cpu:.2f}x schedules per CPU second, {a_wall / b_wall:.2f}x per wall "
                  f"second, whole search {b_whole / a_whole:.2f}x faster (wall)")
            keys = ("found", "schedules", "baseline_failed")
            for r in runs[(script, "this")] + runs[(script, "baseline")]:
                if any(r[k] != best["baseline"][k] for k in keys):
                    same = False
                    print(f"  DIFFERENT: {r['code']}: {[r[k] for k in keys]} vs {[best['baseline'][k] for k in keys]}")
        found = best["this"]["found"]
        print(f"  found: {found or 'nothing'}")
    if args.baseline:
        print("same failures, shrunk schedules and schedule counts as the baseline: " + ("yes" if same else "NO"))
        sys.exit(0 if same else 1)


if __name__ == "__main__":
    main()
