"""Benchmark (issue #10): user scripts on simulated ranks against real Gloo, hang latency, and
the script fuzzer's throughput, each with its ratio to the target.

1. **Wall time, simulator vs real Gloo.** Each example runs alternately in the simulator
   and on real Gloo through the same launcher (the script backend's "gloo" mode: the same
   processes, real Gloo groups), `--repeat` times each; the best of each and their ratio
   (sim / real). Target: <= 1 (the simulator is not slower). Both include starting the
   processes and importing torch, as a user's run does.
2. **Hang latency.** For the examples that hang in the simulator: the time from the last
   rank blocking to the hang being detected and to the report being ready (worst run).
   Target: <= 2 s (issue 10's acceptance).
3. **Fuzz throughput.** `simdist fuzz` on the DataLoader DDP example under Join (nothing to
   find, so every schedule runs), `--fuzz-budget` schedules over world sizes 2-4 and caps
   1-8, ranks forked by the fuzzer's fork server: schedules/s, and the whole search's time.
   Target: 200 schedules in <= 180 s (>= 1.1 schedules/s) on a 2-core machine.

    python bench/script_walltime.py [--repeat 3] [--fuzz-budget 200] [--no-fuzz] [SCRIPT ...]
"""

from __future__ import annotations

import argparse
import contextlib
import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

from simdist.fuzz.scripts import Space, fuzz_script
from simdist.script import run_script

ROOT = Path(__file__).resolve().parent.parent
EXAMPLES = ROOT / "examples"
# (script, torchrun ranks or None for a script that starts its own, --batches)
DEFAULT = [("join_tutorial_ddp.py", None, None), ("join_tutorial_ddp_zero.py", None, None),
           ("join_tutorial_counter.py", None, None), ("dist_tutorial_allreduce.py", None, None),
           ("fuzz_ddp_dataloader_join.py", 2, "5,6"), ("join_tutorial_no_join.py", None, None),
           ("fuzz_ddp_dataloader_no_join.py", 2, "5,6")]
RATIO_TARGET = 1.0
HANG_TARGET_S = 2.0
FUZZ_TARGET_S = 180.0  # for 200 schedules
FUZZ_SCRIPT = "fuzz_ddp_dataloader_join.py"


@contextlib.contextmanager
def _scripts_stderr_discarded() -> Iterator[None]:
    """The ranks inherit this process's stderr: the tracebacks that ranks print when they fail
    on real Gloo (as they should: "Connection closed by peer") would bury the table."""
    sys.stderr.flush()
    saved, devnull = os.dup(2), os.open(os.devnull, os.O_WRONLY)
    os.dup2(devnull, 2)
    try:
        yield
    finally:
        os.dup2(saved, 2)
        os.close(saved)
        os.close(devnull)


def _timed(path: Path, mode: str, nproc: int | None, batches: str | None) -> tuple[float, dict[str, float], str]:
    t0 = time.perf_counter()
    with _scripts_stderr_discarded():
        rep = run_script(path, mode=mode, nproc_per_node=nproc, batches=batches, timeout_s=600,
                         stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, rep.timings, rep.outcome


def walltimes(scripts: list[tuple[str, int | None, str | None]], repeat: int) -> None:
    print(f"{'script':40} {'sim s':>7} {'real s':>7} {f'sim/real (<= {RATIO_TARGET:g})':>16}  outcome sim/real  "
          f"hang detect / report s (target <= {HANG_TARGET_S:g})")
    ratios, hangs = [], []
    for name, nproc, batches in scripts:
        path = Path(name) if Path(name).exists() else EXAMPLES / name
        best = {"sim": float("inf"), "gloo": float("inf")}
        hang: list[tuple[float, float]] = []
        outcome = {}
        for _ in range(repeat):
            for mode in ("sim", "gloo"):
                wall, timings, outcome[mode] = _timed(path, mode, nproc, batches)
                best[mode] = min(best[mode], wall)
                if "hang_detect_s" in timings:
                    hang.append((timings["hang_detect_s"], timings["hang_report_s"]))
        ratio = best["sim"] / best["gloo"]
        ratios.append(ratio)
        h = "-"
        if hang:
            worst = max(y for _, y in hang)
            hangs.append(worst)
            h = f"{max(x for x, _ in hang):.3f} / {worst:.3f} ({worst / HANG_TARGET_S:.2f} of target)"
        label = f"{path.name}" + (f" -n{nproc} --batches {batches}" if nproc else "")
        print(f"{label:40} {best['sim']:7.2f} {best['gloo']:7.2f} {ratio:16.2f}  "
              f"{outcome['sim'] + '/' + outcome['gloo']:<17} {h}")
    print(f"worst sim/real ratio {max(ratios):.2f} (target <= {RATIO_TARGET:g}); "
          + (f"worst hang report {max(hangs):.3f} s (target <= {HANG_TARGET_S:g} s)" if hangs else "no hang"))


def fuzz_throughput(budget: int) -> None:
    space = Space(str(EXAMPLES / FUZZ_SCRIPT), worlds=(2, 4), batches=(1, 8))
    res = fuzz_script(space, budget=budget, seed=0, out_dir=None)
    target_s = FUZZ_TARGET_S * budget / 200
    print(f"fuzz {FUZZ_SCRIPT} (world sizes 2-4, caps 1-8, seed 0): {res.schedules} schedules "
          f"({res.examples} examples) in {res.seconds:.1f} s = {res.rate:.2f} schedules/s; "
          f"{'FAIL' if res.failed else 'no failure'}")
    print(f"  target: {budget} schedules in <= {target_s:.0f} s ({budget / target_s:.2f} schedules/s): "
          f"{res.seconds / target_s:.2f} of the time allowed, {res.rate / (budget / target_s):.2f}x the rate")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scripts", nargs="*", help="scripts that start their own ranks (default: the examples above)")
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--fuzz-budget", type=int, default=200)
    ap.add_argument("--no-fuzz", action="store_true")
    a = ap.parse_args()
    walltimes([(s, None, None) for s in a.scripts] or DEFAULT, a.repeat)
    if not a.no_fuzz:
        fuzz_throughput(a.fuzz_budget)


if __name__ == "__main__":
    main()
