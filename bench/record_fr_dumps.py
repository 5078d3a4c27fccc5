"""Record the Flight Recorder dumps of every bundled scenario that hangs, errors or mismatches,
on real Gloo, the way torch leaves them in production: into tests/data/flightrec/<scenario>/.

Each rank runs with torch's own variables set by the launcher (`simdist.flightrec.format.fr_env`):
``TORCH_FR_BUFFER_SIZE``, ``TORCH_FR_DUMP_TEMP_FILE=<folder>/comm_lib_trace_rank_`` (the rank
writes torch's pickled dump there when it ends: done, raised, or told by the watchdog that the
run hangs -- ProcessGroupNCCL's watchdog does this on a timeout; Gloo's has none) and
``TORCHELASTIC_ERROR_FILE=<folder>/<rank>/error.json`` (torchelastic's ErrorHandler writes a
rank's uncaught exception there). What lands in the folder is torch's bytes, not simdist's
record of the run.

The files are committed (a few KiB each: pickle memoises the repeated frames) because a real
run of all of them takes minutes on a loaded 2-core machine, which CI cannot spend on every
run; `tests/test_flightrec_real.py` records one scenario live, and the fixtures' test checks
that every failing bundled scenario has one. Re-run this after torch or a scenario changes:

    .venv/bin/python bench/record_fr_dumps.py [SCENARIO_NAME ...]
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import tempfile
import time
from pathlib import Path

from real_backend.launch import run_real
from simdist.check.classify import check_run
from simdist.scenario import Scenario, load_scenario
from simdist.sim import simulate

ROOT = Path(__file__).resolve().parents[1]

OUT = ROOT / "tests" / "data" / "flightrec"
SCENARIOS = ROOT / "scenarios"


def failing_scenarios() -> list[Path]:
    """Bundled scenarios whose simulated run fails the checker (hang, error, mismatch)."""
    out = []
    for path in sorted(SCENARIOS.glob("*.toml")):
        s = load_scenario(path)
        if check_run(simulate(s), s).failed:
            out.append(path)
    return out


def record(path: Path, dest: Path) -> dict:
    """Run the scenario on real Gloo with torch's dump variables; copy the dumps and error files to `dest`."""
    s: Scenario = load_scenario(path, "real")
    with tempfile.TemporaryDirectory(prefix="simdist-fr-") as tmp:
        folder = Path(tmp)
        t = time.monotonic()
        report = run_real(s, fr_dumps=folder)
        if dest.exists():
            shutil.rmtree(dest)
        dest.mkdir(parents=True)
        kept = []
        for f in sorted(folder.rglob("*")):
            if f.is_file() and not f.name.endswith(".sock"):
                target = dest / f.relative_to(folder)
                target.parent.mkdir(parents=True, exist_ok=True)
                shutil.copy2(f, target)
                kept.append(str(f.relative_to(folder)))
    return {"scenario": path.name, "outcome": report.outcome, "statuses": [r.status for r in report.ranks],
            "files": kept, "seconds": round(time.monotonic() - t, 1)}


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("names", nargs="*", help="scenario names (default: every failing bundled scenario)")
    args = ap.parse_args(argv)
    paths = [SCENARIOS / f"{n}.toml" for n in args.names] if args.names else failing_scenarios()
    import torch

    manifest_path = OUT / "manifest.json"
    manifest = json.loads(manifest_path.read_text()) if manifest_path.exists() else {}
    for path in paths:
        info = record(path, OUT / path.stem)
        info["torch"] = torch.__version__
        manifest[path.stem] = info
        print(json.dumps(info), flush=True)
    OUT.mkdir(parents=True, exist_ok=True)
    manifest_path.write_text(json.dumps(dict(sorted(manifest.items())), indent=1) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
