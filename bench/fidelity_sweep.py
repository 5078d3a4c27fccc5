"""Sim-vs-real agreement on random scenarios: the simulator's broadest fidelity check.

Runs N random scenarios of `simdist.testing.fidelity` (see there for what they contain) in
the simulator and on real Gloo, and prints the agreement rate. Scenarios that disagree are
written to --out for `simdist compare` to replay; `--index K` runs (and writes) only the
sweep's scenario K, e.g. to re-check one disagreement.

    python bench/fidelity_sweep.py --seed 2 --n 20 [--out fidelity-failures] [--index K]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path

import tomli_w

from real_backend.launch import run_real
from real_backend.workers import WorkerZygote
from simdist.compare import compare_reports, format_comparison
from simdist.scenario import parse_scenario
from simdist.sim import simulate
from simdist.testing.fidelity import random_scenario, sweep_scenario


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--index", type=int, default=None, help="run only the sweep's scenario with this index")
    ap.add_argument("--out", type=Path, default=Path("fidelity-failures"))
    a = ap.parse_args()
    if a.index is not None:
        scenarios = iter([sweep_scenario(a.seed, a.index)])
        n = 1
    else:
        rng = random.Random(a.seed)
        scenarios = (random_scenario(rng, f"sweep{a.seed}_{k}") for k in range(a.n))
        n = a.n
    agree = 0
    t0 = time.monotonic()
    with WorkerZygote() as zygote:  # torch imported once for the whole sweep
        for d in scenarios:
            s = parse_scenario(d)
            sim = simulate(s)
            cmp = compare_reports(sim, run_real(s, zygote=zygote))
            agree += cmp.agree
            print(f"{d['name']}: {'agree' if cmp.agree else 'DIFFER'} ({sim.outcome})", flush=True)
            if not cmp.agree or a.index is not None:
                a.out.mkdir(parents=True, exist_ok=True)
                (a.out / f"{d['name']}.toml").write_text(tomli_w.dumps(d))
            if not cmp.agree:
                print(format_comparison(cmp))
    print(f"agreement: {agree}/{n} random scenarios ({agree / max(n, 1):.0%}) in {time.monotonic() - t0:.0f} s, "
          f"seed {a.seed}")
    return 0 if agree == n else 1


if __name__ == "__main__":
    sys.exit(main())
