"""Sim-vs-real agreement on random user-style scripts: bench/fidelity_sweep.py for scripts.

Generates N random torch.distributed scripts (`simdist.testing.scripts`: uneven per-rank
loops, collectives of random dtypes and sizes, async work, a subgroup, send/recv, a rank
that returns, raises or exits, DDP with and without Join, Gloo timeouts, and the rest of
torch.distributed's Gloo surface: `simdist.testing.script_api`), runs each on
simulated ranks and on real Gloo (each mode's ranks forked by one fork server for the whole
sweep), and diffs them as `simdist compare SCRIPT.py` does (`simdist.compare`: outcome,
status and error category per rank, the sequence of operations, where each rank ended, the
printed lines). Prints agreement k/N and each difference; a script that differs is kept in
--out with a shell line that reruns the comparison. A case whose only differences are a race
of real processes (`simdist.races`: a peer's teardown, where a rank the simulator
fails as a peer exits times out on real Gloo, its deadline within `EXIT_RACE_S` of that exit;
a late rank's rendezvous, refused or timed out by the ports' draw; or a group's connection, where a rank still connecting a group on a loaded host fails with
the closure of a peer that ran ahead and exited) is printed as RACE with the reason, kept,
and counted apart: never as agreement.

    python bench/script_sweep.py --seed 1 --n 15 [--world 2-4] [--out script-failures] [--index K]
"""

from __future__ import annotations

import argparse
import random
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from simdist.compare import compare_reports, format_comparison
from simdist.races import EXIT_RACE_S, named_races
from simdist.script import run_script
from simdist.script.zygote import Zygote
from simdist.testing.scripts import GeneratedScript, random_script, sweep_script

# Watchdog of both runs (seconds without communication): ends on real Gloo what hangs in a
# script that set no Gloo timeout (the simulator proves the hang at once). The scripts take
# well under a second of work, so a few seconds of silence is a hang.
WATCHDOG_S = 6.0


def compare_script(path: Path, world: int, zygotes: dict[str, Zygote]):
    """`simdist compare` on one script: the simulated run, the real one, their comparison."""
    sim, real = (run_script(path, nproc_per_node=world, backend="gloo", mode=mode, timeout_s=WATCHDOG_S,
                            measure_compute=False, zygote=zygotes[mode]) for mode in ("sim", "gloo"))
    return sim, real, compare_reports(sim, real)


def _worlds(text: str) -> tuple[int, int]:
    lo, _, hi = text.partition("-")
    a, b = int(lo), int(hi or lo)
    if not 2 <= a <= b:
        raise argparse.ArgumentTypeError(f"--world: expected LO-HI with 2 <= LO <= HI, got {text!r}")
    return a, b


def _keep(out: Path, g: GeneratedScript) -> Path:
    out.mkdir(parents=True, exist_ok=True)
    path = out / f"{g.name}.py"
    path.write_text(g.source)
    (out / f"{g.name}.sh").write_text(f"simdist compare {path} --nproc-per-node {g.world} --timeout {WATCHDOG_S:g}\n")
    return path


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--world", type=_worlds, default=(2, 4), help="world sizes LO-HI (default 2-4)")
    ap.add_argument("--index", type=int, default=None, help="run only the sweep's case with this index")
    ap.add_argument("--out", type=Path, default=Path("script-failures"))
    a = ap.parse_args()
    if a.index is not None:
        cases, n = iter([sweep_script(a.seed, a.index, a.world)]), 1
    else:
        rng = random.Random(a.seed)
        cases, n = (random_script(rng, f"case{a.seed}_{k}", a.world) for k in range(a.n)), a.n
    agree, raced, t0 = 0, 0, time.monotonic()
    with (tempfile.TemporaryDirectory() as tmp,
          Zygote(None, mode="sim", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as zs,
          Zygote(None, mode="gloo", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as zg):
        for g in cases:
            path = Path(tmp) / f"{g.name}.py"
            path.write_text(g.source)
            t = time.monotonic()
            sim, real, cmp = compare_script(path, g.world, {"sim": zs, "gloo": zg})
            races = named_races(sim, real, cmp)
            agree += cmp.agree
            raced += bool(races)
            verdict = "agree" if cmp.agree else f"RACE ({', '.join(sorted({r.kind for r in races}))})" if races \
                else "DIFFER"
            print(f"{g.name} ({g.world} ranks; {', '.join(sorted(g.features))}): "
                  f"{verdict} (sim {sim.outcome}, real {real.outcome}; {time.monotonic() - t:.1f} s)", flush=True)
            if not cmp.agree or a.index is not None:
                kept = _keep(a.out, g)
                print(f"  kept: {kept}")
            for race in races:
                print(f"  {race.describe()}", flush=True)
            if not cmp.agree and not races:
                print(format_comparison(cmp), flush=True)
    print(f"agreement: {agree}/{n} random scripts ({agree / max(n, 1):.0%}) in {time.monotonic() - t0:.0f} s, "
          f"seed {a.seed}" + (f"; {raced} more differ only by races of real processes (RACE above: a peer's teardown "
                              f"against a deadline {EXIT_RACE_S:g} s or less away, a rendezvous, or a group's connection), not counted"
                              if raced else ""))
    return 0 if agree + raced == n else 1


if __name__ == "__main__":
    sys.exit(main())
