"""Malformed and adversarial inputs: nothing crashes, hangs or exhausts simdist (issue 16).

    python bench/malformed_inputs.py [--cases 10000] [--cli 300] [--seed 0] [--jobs 2]

Generates `--cases` scenario and template inputs (`simdist.testing.malformed`: mutations of
the bundled scenarios and templates, broken bytes, special files) and feeds each through the
Python API (`exercise`). A sample of the files (`--cli`) also goes through
the CLI (`python -m simdist run|fuzz FILE`).

Each case runs in a worker process under a 10 s alarm and a 4 GiB address-space cap (a
safety net); the worker reports every case's time and its peak resident memory growth.
Printed: how many inputs were accepted, rejected with one line per problem (and how many
of those name a field on every line), and the counts that must be 0: uncaught exceptions,
exit 3, tracebacks, invalid JSON, errors that are not one line per problem, runs over 10 s,
runs over 1 GB; then each against its
target. A CLI call's time includes the interpreter's and the CLI's start-up, which on a
busy host alone takes seconds; the 10 s target counts the time beyond it (the median
start-up, `simdist --version`, is measured and printed). tests/test_bad_input.py runs the
same generator as a hypothesis property.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import random
import re
import resource
import signal
import statistics
import subprocess
import sys
import tempfile
import time
import traceback
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from simdist.testing.malformed import CASE_SECONDS, Case, bundled_bases, exercise, make_case, materialise, special_path

ROOT = Path(__file__).resolve().parents[1]  # the checkout: its scenarios/ are what the cases mutate

MEMORY_LIMIT = 1 << 30  # 1 GiB: what one input may make simdist hold at most
ADDRESS_CAP = 4 << 30  # the worker's RLIMIT_AS: a runaway case fails instead of swapping the host


@dataclass
class Result:
    index: int
    kind: str
    how: str
    label: str
    status: str  # accepted | rejected | uncaught | timeout
    seconds: float
    rss_growth: int  # bytes the worker's peak resident memory grew by during this case
    message: str = ""
    one_line: bool = True
    names_field: bool = False
    json_ok: bool = True


_FIELD = re.compile(r"^(case-\d+|[^:]*\.toml|/[^:]*): ([A-Za-z_][\w\-]*(\[\d+\])?([.][\w\-]+(\[\d+\])?)*)(: | \()")


def _alarm(*_: Any) -> None:
    raise TimeoutError("case ran over its time")


def run_case(case: Case, tmp: Path) -> Result:
    """`exercise` under the alarm, classified."""
    from simdist.errors import SimdistError

    path = materialise(case, tmp)  # writing the input is not simdist's time
    before = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    t0 = time.perf_counter()
    status, message, json_ok = "uncaught", "", True
    signal.setitimer(signal.ITIMER_REAL, CASE_SECONDS)
    try:
        status, message, json_ok = exercise(case, tmp, path=path)
    except SimdistError as e:
        status, message = "rejected", str(e)
    except TimeoutError as e:
        status, message = "timeout", str(e)
    except Exception as e:  # noqa: BLE001 - what the benchmark is looking for
        status = "uncaught"
        message = f"{type(e).__name__}: {e}"[:300] + " | " + traceback.format_exc(limit=-3).replace("\n", " | ")[-600:]
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
    seconds = time.perf_counter() - t0
    if seconds > CASE_SECONDS and status != "uncaught":
        status = "timeout"
    growth = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 - before
    lines = message.splitlines() or [""]
    # one line per problem (a scenario's every problem at once), each naming the source
    one_line = all(ln.startswith(lines[0].partition(": ")[0] + ": ") for ln in lines) if status == "rejected" else True
    names = all(_FIELD.match(ln) for ln in lines) if status == "rejected" else False
    return Result(case.index, case.kind, case.how, case.label, status, seconds, growth, message[:900], one_line,
                  names, json_ok)


def worker(seed: int, indices: range) -> None:
    """One worker process: cases `indices`, one JSON line each on stdout."""
    resource.setrlimit(resource.RLIMIT_AS, (ADDRESS_CAP, ADDRESS_CAP))
    signal.signal(signal.SIGALRM, _alarm)
    # what `exercise` imports, loaded before any case is timed (seconds on a busy host)
    import simdist.check.classify  # noqa: F401
    import simdist.fuzz.runner  # noqa: F401
    import simdist.sim  # noqa: F401
    bases = bundled_bases(ROOT / "scenarios")
    with tempfile.TemporaryDirectory(prefix="simdist-malformed-") as d:
        tmp = Path(d)
        for i in indices:
            try:
                case = make_case(i, random.Random(f"{seed}:{i}"), bases)
            except Exception as e:  # noqa: BLE001 - the generator's own trouble, not simdist's
                print(json.dumps(asdict(Result(i, "?", "?", "generator failed", "skipped", 0.0, 0, repr(e)[:200]))))
                continue
            try:
                res = run_case(case, tmp)
            except MemoryError:
                res = Result(i, case.kind, case.how, case.label, "uncaught", 0.0, ADDRESS_CAP, "MemoryError")
            print(json.dumps(asdict(res)), flush=True)


# ----------------------------------------------------------------------------- the CLI sample
def cli_case(case: Case, tmp: Path) -> dict[str, Any]:
    """`python -m simdist run FILE` (or `fuzz FILE`) on a file case; exit code and stderr checks."""
    if case.how == "path":
        path = special_path(case.data, tmp)
    else:
        path = tmp / f"cli-{case.index}.toml"
        path.write_bytes(case.data)
    cmd = [sys.executable, "-m", "simdist"]
    cmd += (["fuzz", str(path), "-n", "3", "--no-shrink", "--no-db", "-q", "--out", str(tmp / "cli-out")]
            if case.kind == "template" else ["run", str(path)])
    t0 = time.perf_counter()
    try:
        p = subprocess.run(cmd, capture_output=True, text=True, timeout=60, cwd=ROOT, errors="replace")
        rc, err = p.returncode, p.stderr
    except subprocess.TimeoutExpired:
        rc, err = -1, "timeout"
    seconds = time.perf_counter() - t0
    lines = [ln for ln in err.splitlines() if ln.strip()]
    return {"index": case.index, "label": case.label, "rc": rc, "seconds": seconds,
            "traceback": "Traceback" in err, "one_line": rc != 2 or all(ln.startswith("error: ") for ln in lines),
            "stderr": err[-400:]}


def _startup_seconds(n: int = 5) -> float:
    """Median seconds of `python -m simdist --version` now: what every CLI call pays first."""
    times = []
    for _ in range(n):
        t0 = time.perf_counter()
        subprocess.run([sys.executable, "-m", "simdist", "--version"], capture_output=True, cwd=ROOT, timeout=120)
        times.append(time.perf_counter() - t0)
    return statistics.median(times)


# ----------------------------------------------------------------------------- the driver
def _run_workers(seed: int, cases: int, jobs: int) -> list[Result]:
    chunks = [range(k, cases, jobs) for k in range(jobs)]
    procs = [subprocess.Popen([sys.executable, __file__, "--worker", "--seed", str(seed), "--start", str(c.start),
                               "--step", str(c.step), "--cases", str(cases)], stdout=subprocess.PIPE, text=True,
                              cwd=ROOT, env={**os.environ, "OMP_NUM_THREADS": "1"}) for c in chunks]
    results: list[Result] = []
    for p, chunk in zip(procs, chunks, strict=True):
        assert p.stdout is not None
        seen = set()
        for line in p.stdout:
            r = Result(**json.loads(line))
            seen.add(r.index)
            results.append(r)
            if len(results) % 1000 == 0:
                print(f"  {len(results)} cases ...", file=sys.stderr, flush=True)
        p.wait()
        for i in chunk:  # a worker that died (killed by the kernel) leaves its cases unreported
            if i not in seen:
                results.append(Result(i, "?", "?", "worker died", "uncaught", 0.0, 0, f"worker exit {p.returncode}"))
    return results


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--cases", type=int, default=10_000)
    ap.add_argument("--cli", type=int, default=300, help="how many of the file cases also go through the CLI")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    ap.add_argument("--start", type=int, default=0, help=argparse.SUPPRESS)
    ap.add_argument("--step", type=int, default=1, help=argparse.SUPPRESS)
    args = ap.parse_args()
    if args.worker:
        worker(args.seed, range(args.start, args.cases, args.step))
        return
    t0 = time.perf_counter()
    results = _run_workers(args.seed, args.cases, args.jobs)
    api_s = time.perf_counter() - t0
    bases = bundled_bases(ROOT / "scenarios")
    args.startup_s = _startup_seconds()
    with tempfile.TemporaryDirectory(prefix="simdist-malformed-cli-") as d:
        files = [r.index for r in results if r.how in ("file", "path")]  # what a command line can take
        sample = sorted(random.Random(args.seed).sample(files, min(args.cli, len(files))))
        cli = [cli_case(make_case(i, random.Random(f"{args.seed}:{i}"), bases), Path(d)) for i in sample]
    _print(results, cli, api_s, args)


def _print(results: list[Result], cli: list[dict[str, Any]], api_s: float, args: argparse.Namespace) -> None:
    by = {s: [r for r in results if r.status == s] for s in ("accepted", "rejected", "uncaught", "timeout", "skipped")}
    rejected = by["rejected"]
    print(f"simdist malformed inputs: {len(results)} cases through the Python API in {api_s:.0f} s "
          f"(seed {args.seed}), {len(cli)} of them through the CLI")
    print(f"  kinds: {sum(r.kind == 'scenario' for r in results)} scenarios, "
          f"{sum(r.kind == 'template' for r in results)} templates; "
          f"{sum(r.how == 'file' for r in results)} files, {sum(r.how == 'dict' for r in results)} dicts, "
          f"{sum(r.how == 'path' for r in results)} special paths")
    print(f"  accepted and run: {len(by['accepted'])}; generator failures (skipped): {len(by['skipped'])}")
    print(f"  rejected with one line per problem: {sum(r.one_line for r in rejected)} "
          f"({sum(r.names_field for r in rejected)} name the file and a field)")
    slowest = max(results, key=lambda r: r.seconds)
    hungriest = max(results, key=lambda r: r.rss_growth)
    print(f"  slowest case: {slowest.seconds:.2f} s ({slowest.label[:70]}); largest memory growth: "
          f"{hungriest.rss_growth / 2**20:.0f} MiB ({hungriest.label[:70]})")
    cli_slowest = max((c["seconds"] for c in cli), default=0.0)
    counts = {
        "uncaught exceptions (API)": len(by["uncaught"]),
        "errors not one line per problem (API)": sum(not r.one_line for r in rejected),
        "invalid JSON written (API)": sum(not r.json_ok for r in results),
        f"runs over {CASE_SECONDS:g} s (API)": len(by["timeout"]),
        "runs over 1 GiB (API)": sum(r.rss_growth > MEMORY_LIMIT for r in results),
        "exit 3 (CLI)": sum(c["rc"] == 3 for c in cli),
        "tracebacks (CLI)": sum(c["traceback"] for c in cli),
        "exit codes other than 0/1/2 (CLI)": sum(c["rc"] not in (0, 1, 2) for c in cli),
        "errors not one line per problem (CLI)": sum(not c["one_line"] for c in cli),
        f"runs over {CASE_SECONDS:g} s (CLI, beyond start-up)": sum(c["seconds"] - args.startup_s > CASE_SECONDS
                                                                    for c in cli),
    }
    print(f"  CLI exit codes: {_tally(c['rc'] for c in cli)}; slowest {cli_slowest:.2f} s; start-up alone "
          f"(`simdist --version`, median) {args.startup_s:.2f} s; over {CASE_SECONDS:g} s with start-up included: "
          f"{sum(c['seconds'] > CASE_SECONDS for c in cli)}")
    print("against the targets (each must be 0):")
    for name, n in counts.items():
        print(f"  {name:<52} {n:>6}   target 0   {'met' if n == 0 else 'NOT MET'}")
    met = sum(n == 0 for n in counts.values())
    print(f"targets met: {met} of {len(counts)} ({met / len(counts):.0%})")
    bad = by["uncaught"] + by["timeout"] + [r for r in rejected if not r.one_line]
    for r in bad[:20]:
        print(f"  case {r.index} [{r.kind}/{r.how}] {r.label[:80]}: {r.status}: {r.message[:300]}")
    for c in [c for c in cli if c["rc"] not in (0, 1, 2) or c["traceback"] or not c["one_line"]][:10]:
        print(f"  CLI case {c['index']} {c['label'][:60]}: exit {c['rc']}: {c['stderr'][-300:]}")


def _tally(xs: Any) -> str:
    counts: dict[Any, int] = {}
    for x in xs:
        counts[x] = counts.get(x, 0) + 1
    return ", ".join(f"{k}: {v}" for k, v in sorted(counts.items()))


if __name__ == "__main__":
    with contextlib.suppress(KeyboardInterrupt):
        main()
