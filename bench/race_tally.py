"""How often does a script's real run differ from its simulated one, and how? A tally for
races of real processes (`simdist.races`): one simulated run, then N real Gloo runs
(each mode's ranks forked by one fork server), each compared as `simdist compare` does and
named: agree, a named race (its kinds: exit, rendezvous, connect: `Race.kind`), or a difference. Every run that does
not agree is printed with each rank's status, error and lines, so a rare outcome seen once
can be read; at the end, each real outcome (rank: status/error category) with its count,
beside the simulated one. Run it beside other load (a test suite) to see what a loaded host does.

    python bench/race_tally.py tests/scripts/timed_out_root_fed.py --nproc 3 --n 60 [--keep DIR] [-- ARGS]
    python bench/race_tally.py examples/spawn_init_methods.py --n 30 -- --fail 1   # starts its own ranks

--keep DIR writes the simulated Report (sim.json) and each real run that does not agree
(real-K.json) as JSON (`Report.from_dict` reads them back): a rare shape seen once becomes a
test fixture that needs no luck.
"""

from __future__ import annotations

import argparse
import collections
import subprocess
import sys
from pathlib import Path

from simdist.compare import compare_reports, format_comparison
from simdist.races import named_races
from simdist.report import Report
from simdist.script import run_script
from simdist.script.zygote import Zygote

WATCHDOG_S = 60.0


def _ranks(report: Report) -> str:
    return "\n".join(f"    rank {r.rank}: {r.status}"
                     + (f" [{r.error.category}] {' '.join(r.error.message.split())[:200]}" if r.error else "")
                     + f" | lines {r.output} | ops {[(e.op, e.seq, e.completed) for e in r.trace]}" for r in report.ranks)


def outcome(report: Report) -> str:
    """The run's outcome per rank, in a word each: what the tally counts apart from agreement."""
    return " ".join(f"{r.rank}:{r.status}" + (f"/{r.error.category}" if r.error else "") for r in report.ranks)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("script", type=Path)
    ap.add_argument("--nproc", type=int, default=None,
                    help="torchrun-style ranks; left out: the script starts its own (mp.spawn)")
    ap.add_argument("--n", type=int, default=20)
    ap.add_argument("--keep", type=Path, default=None, help="write sim.json and each differing real-K.json here")
    argv = sys.argv[1:]
    cut = argv.index("--") if "--" in argv else len(argv)
    a, script_args = ap.parse_args(argv[:cut]), argv[cut + 1:]  # the script's own arguments: after --
    tally: collections.Counter[str] = collections.Counter()
    outcomes: collections.Counter[str] = collections.Counter()
    with (Zygote(None, mode="sim", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as zs,
          Zygote(None, mode="gloo", stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as zg):
        def run(mode: str, z: Zygote) -> Report:
            return run_script(a.script, script_args, nproc_per_node=a.nproc, backend="gloo", mode=mode,
                              timeout_s=WATCHDOG_S, measure_compute=False, zygote=z)

        sim = run("sim", zs)
        if a.keep is not None:
            a.keep.mkdir(parents=True, exist_ok=True)
            (a.keep / "sim.json").write_text(sim.to_json())
        for k in range(a.n):
            real = run("gloo", zg)
            cmp = compare_reports(sim, real)
            races = named_races(sim, real, cmp)
            kinds = sorted({r.kind for r in races})
            kind = "agree" if cmp.agree else f"RACE ({', '.join(kinds)})" if races else "DIFFER"
            tally[kind] += 1
            outcomes[outcome(real)] += 1
            print(f"run {k}: {kind}", flush=True)
            if not cmp.agree:
                print(_ranks(real), flush=True)
                if a.keep is not None:
                    (a.keep / f"real-{k}.json").write_text(real.to_json())
                for race in races:
                    print(f"  {race.describe()}", flush=True)
                if not races:
                    print(format_comparison(cmp), flush=True)
    print(f"{a.script.name}: {dict(tally)} of {a.n} real runs")
    print(f"simulated: {outcome(sim)}; real: {dict(outcomes)}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
