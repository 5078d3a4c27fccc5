"""Benchmark (issue #10): example scripts on simulated ranks vs on real Gloo, same launcher.

For each script, runs it alternately in the simulator and on real Gloo (the script backend's
"gloo" mode: same processes, real Gloo groups), `--repeat` times each, and prints the best
wall time of each, their ratio (sim / real; the simulator should not be slower), and for
scripts that hang in the simulator the time from the last rank blocking to the hang being
detected and to the report being ready. Wall times include starting the processes and
importing torch in each, which dominate short programs.

    python bench/script_walltime.py [--repeat 3] [SCRIPT ...]
"""

from __future__ import annotations

import argparse
import subprocess
import time
from pathlib import Path

from simdist.script import run_script

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
DEFAULT = ["join_tutorial_ddp.py", "join_tutorial_ddp_zero.py", "join_tutorial_counter.py",
           "dist_tutorial_allreduce.py", "dist_tutorial_sync_sgd.py", "join_tutorial_no_join.py"]


def _timed(path: Path, mode: str) -> tuple[float, dict[str, float], str]:
    t0 = time.perf_counter()
    rep = run_script(path, mode=mode, timeout_s=600, stdout=subprocess.DEVNULL)
    return time.perf_counter() - t0, rep.timings, rep.outcome


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("scripts", nargs="*", default=DEFAULT)
    ap.add_argument("--repeat", type=int, default=3)
    a = ap.parse_args()
    print(f"{'script':32} {'sim s':>7} {'real s':>7} {'ratio':>6}  outcome (sim/real)  hang detect / report s")
    for name in a.scripts:
        path = Path(name) if Path(name).exists() else EXAMPLES / name
        best = {"sim": float("inf"), "gloo": float("inf")}
        hang: list[tuple[float, float]] = []
        outcome = {}
        for _ in range(a.repeat):
            for mode in ("sim", "gloo"):
                wall, timings, outcome[mode] = _timed(path, mode)
                best[mode] = min(best[mode], wall)
                if "hang_detect_s" in timings:
                    hang.append((timings["hang_detect_s"], timings["hang_report_s"]))
        h = f"{max(x for x, _ in hang):.3f} / {max(y for _, y in hang):.3f} (worst)" if hang else "-"
        print(f"{path.name:32} {best['sim']:7.2f} {best['gloo']:7.2f} {best['sim'] / best['gloo']:6.2f}  "
              f"{outcome['sim']}/{outcome['gloo']:<12} {h}")


if __name__ == "__main__":
    main()
