"""Fuzz throughput: schedules checked per second on an 8-rank, up-to-100-iteration DDP (3 buckets)
+ ZeroRedundancyOptimizer template under Join (a correct loop, so nothing stops the search early),
on one core (--jobs 1) and on two worker processes (--jobs 2), measured in the same run.

    python bench/fuzz_throughput.py [--budget 1000] [--seed 0] [--reps 2] [--jobs 2]
                                    [--baseline DIR] [--profile] [--no-compress]

Targets (issue 14): >= 500 schedules/s on one core; --jobs 2 >= 1.7x of --jobs 1 on a
2-core machine. Every measurement is a fresh process (this file with --one) running one
search; runs alternate (--jobs 1, --jobs N, and with --baseline the same two on the code in
DIR, e.g. a `git archive` of an older commit, imported through PYTHONPATH), and the best of
--reps is kept for each. Both --jobs values search the same shards (same seed, same answer:
checked), so their ratio is the parallel speed-up alone.

Figures, each with its ratio to the target:
* one core, CPU time: schedules / CPU seconds of the search's process and its children
  (imports and start-up not counted). The figure to compare on a shared machine.
* one core, wall: schedules / wall seconds; on a loaded machine this is mostly the load.
* --jobs N speed-up, wall: what it is on this machine right now (with other jobs running,
  N processes get more of the machine than one, or less).
* --jobs N speed-up, CPU time: CPU seconds of the --jobs 1 search over the CPU seconds of
  the --jobs N search's busiest process (its shards, run one after another): what the
  wall-clock speed-up would be on N otherwise idle cores, if CPU time did not change with
  the load. Its shortfall from N is the uneven split of shards plus the parallel overhead
  (printed: total CPU of the N processes over the --jobs 1 run's).
--profile prints where one --jobs 1 run spends its time (in this process); --no-compress adds
a run with schedule compression off (simdist/fuzz/compress.py) for comparison.
--sharing measures, on this benchmark's own stream of schedules (one --jobs 1 search in this
process), how much simulation a memo or a shared prefix could save at most: the exact memo's
hit rate (`compress.verdict_key`), the iterations that lie in a prefix shared with an earlier
schedule (nothing a rank does before its input check at iteration i depends on more than
min(count, i), so two compressed schedules with equal min(count, i) on every rank run the
same until then), and the rates those would give if the shared part, or all simulation, cost
nothing; then the most each candidate way to 500/s could give (docs/fuzzing.md, "What would
reach 500/s"): (1) a fast-forward inside a run, (2) free generation, (3) free shared prefixes,
and their combinations; and the hits of a verdict memo up to a relabelling of ranks.
--pairs N (with --baseline) runs N pairs of --jobs 1 searches, this checkout's and the baseline's
side by side, and prints each pair's CPU ratio and the median: the before/after figure that a
loaded machine still resolves to a few percent.
--instructions counts (valgrind) the instructions of judging a schedule, this checkout's and
--baseline's: a before/after figure the load does not move (valgrind is slow: --budget 100).
--floor measures, alternating with full searches, the same search with every schedule's judging
(planning, simulating, checking) replaced by "passed": what hypothesis, instantiating and
validating cost by themselves, hence how many milliseconds 500/s leaves for judging a schedule.
"""

from __future__ import annotations

import argparse
import cProfile
import io
import json
import os
import pstats
import re
import resource
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

TARGET_RATE = 500.0  # schedules/s on one core
TARGET_SPEEDUP = 1.7  # --jobs 2 over --jobs 1
TEMPLATE = {
    "name": "bench_ddp_zero_8rank",
    "world_size": 8,
    "on_finish": "stay",
    "inputs": {"counts": {"each": {"range": [0, 100]}}},
    # three 1.2 MB float32 parameters with a 1 MiB bucket cap: one bucket each after the rebuild
    "model": {"params": [300_000, 300_000, 300_000], "bucket_cap_mb": 1.0},
    "optimizer": {"kind": "adam", "zero": True},
    "join": {"joinables": ["ddp", "zero"]},
    "loop": [{"kind": "forward"}, {"kind": "backward"}, {"kind": "optimizer_step"}],
    "fuzz": {"expect": "ok"},
}


def _load() -> str:
    one, five, _ = os.getloadavg()
    return f"load average {one:.2f} (1 min), {five:.2f} (5 min) on {os.cpu_count()} cores"


def _children_cpu() -> float:
    ru = resource.getrusage(resource.RUSAGE_CHILDREN)
    return ru.ru_utime + ru.ru_stime


def measure_one(budget: int, seed: int, jobs: int, compress: bool = True) -> dict[str, Any]:
    """One search in this process; what it did and what it cost (JSON-able)."""
    from simdist.fuzz.runner import fuzz_template
    from simdist.fuzz.template import parse_template

    t = parse_template(TEMPLATE, source="bench")
    w0, c0, k0 = time.perf_counter(), time.process_time(), _children_cpu()
    res = fuzz_template(t, budget=budget, seed=seed, out_dir=None, use_db=False, compress=compress, jobs=jobs)
    wall, cpu = time.perf_counter() - w0, time.process_time() - c0 + _children_cpu() - k0  # workers are reaped by now
    return {"schedules": res.schedules, "failures": res.failures, "shards": res.shards, "wall": wall, "cpu": cpu,
            "cpu_busiest": getattr(res, "cpu_busiest", None), "cpu_shards": getattr(res, "cpu_seconds", None),
            "compressed": res.compressed, "reused": getattr(res, "reused", None),
            "iterations_run": res.iterations_run, "iterations_full": res.iterations_full}


def _spawn(budget: int, seed: int, jobs: int, code: str | None, *extra: str) -> dict[str, Any]:
    """`measure_one` in a fresh process, on this checkout's simdist or on the one in `code`."""
    env = dict(os.environ)
    if code is not None:
        env["PYTHONPATH"] = str(Path(code).resolve()) + os.pathsep + env.get("PYTHONPATH", "")
    out = subprocess.run([sys.executable, os.path.abspath(__file__), "--one", "--budget", str(budget), "--seed", str(seed),
                          "--jobs", str(jobs), *extra], env=env, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def _best(runs: list[dict[str, Any]], key: str) -> dict[str, Any]:
    return min(runs, key=lambda r: r[key])


def _report(label: str, runs1: list[dict[str, Any]], runsn: list[dict[str, Any]], jobs: int) -> None:
    r1c, r1w, rnw = _best(runs1, "cpu"), _best(runs1, "wall"), _best(runsn, "wall")
    assert (r1c["schedules"], r1c["failures"]) == (rnw["schedules"], rnw["failures"]), \
        "the parallel run searched something else"
    n = r1c["schedules"]
    for jobs_, rs in ((1, runs1), (jobs, runsn)):
        print(f"[{label}] --jobs {jobs_} runs (CPU s / wall s): " + ", ".join(f"{r['cpu']:.2f}/{r['wall']:.2f}" for r in rs))
    rate_cpu, rate_wall = n / r1c["cpu"], n / r1w["wall"]
    print(f"[{label}] {n} distinct schedules, {r1c['shards']} shards, failures: {len(r1c['failures'])}; "
          f"{r1c['compressed']} compressed, {r1c['reused'] if r1c['reused'] is not None else 'n/a'} judged by a "
          f"compressed run already simulated; iterations simulated {r1c['iterations_run']} of "
          f"{r1c['iterations_full']}")
    print(f"[{label}] --jobs 1, CPU time (process + children): {rate_cpu:.1f} schedules/s ({r1c['cpu']:.2f} s) "
          f"-> {rate_cpu / TARGET_RATE:.2f}x of the {TARGET_RATE:.0f}/s target")
    print(f"[{label}] --jobs 1, wall: {rate_wall:.1f} schedules/s ({r1w['wall']:.2f} s) "
          f"-> {rate_wall / TARGET_RATE:.2f}x of the target")
    sw = r1w["wall"] / rnw["wall"]
    print(f"[{label}] --jobs {jobs}, wall: {n / rnw['wall']:.1f} schedules/s ({rnw['wall']:.2f} s) -> speed-up "
          f"{sw:.2f}x over --jobs 1 ({sw / TARGET_SPEEDUP:.2f}x of the {TARGET_SPEEDUP}x target)")
    rnc = _best(runsn, "cpu")
    busiest = _best([r for r in runsn if r["cpu_busiest"] is not None] or [{"cpu_busiest": None}], "cpu_busiest")
    if busiest["cpu_busiest"]:
        sc = r1c["cpu"] / busiest["cpu_busiest"]
        print(f"[{label}] --jobs {jobs}, CPU time: busiest worker {busiest['cpu_busiest']:.2f} s of shards, all "
              f"processes {rnc['cpu']:.2f} s ({rnc['cpu'] / r1c['cpu']:.2f}x the --jobs 1 CPU) -> speed-up on idle "
              f"cores {sc:.2f}x ({sc / TARGET_SPEEDUP:.2f}x of the target)")


def pairs(budget: int, seed: int, n: int, baseline: str) -> None:
    """`n` pairs of --jobs 1 searches, this checkout's then the baseline's, each a fresh process,
    run back to back so both sides of a pair see the same load: the per-pair CPU ratios and
    their median (on a loaded machine best-of-N of separately timed runs varies by more than a
    few percent between repetitions; a pair's ratio does not)."""
    ratios, this, base = [], [], []
    for k in range(n):
        a, b = _spawn(budget, seed, 1, None), _spawn(budget, seed, 1, baseline)
        assert (a["schedules"], a["failures"], a["iterations_run"]) == (b["schedules"], b["failures"],
                                                                         b["iterations_run"]), "different searches"
        this.append(a["cpu"])
        base.append(b["cpu"])
        ratios.append(b["cpu"] / a["cpu"])
        print(f"pair {k}: this {a['cpu']:.2f} s, baseline {b['cpu']:.2f} s CPU -> {ratios[-1]:.3f}x", flush=True)
    ratios.sort()
    med = ratios[n // 2] if n % 2 else (ratios[n // 2 - 1] + ratios[n // 2]) / 2
    best = budget / min(this)
    print(f"pairs: this / baseline, --jobs 1 CPU time: median {med:.3f}x (range {ratios[0]:.3f}-{ratios[-1]:.3f}); "
          f"best runs: this {best:.1f} schedules/s ({best / TARGET_RATE:.2f}x of the {TARGET_RATE:.0f}/s target), "
          f"baseline {budget / min(base):.1f}/s; {_load()}")


def _shared_prefix(counts: list[tuple[int, ...]]) -> tuple[int, int]:
    """(iterations simulated, of those in a prefix shared with an earlier schedule of the stream)."""
    seen: set[tuple[int, ...]] = set()
    total = shared = 0
    for c in counts:
        m = max(c, default=0)
        total += m
        cut = [tuple(min(x, i) for x in c) for i in range(1, m + 1)]
        shared += next((i for i in range(m, 0, -1) if (i, *cut[i - 1]) in seen), 0)
        seen.update((i, *cut[i - 1]) for i in range(1, m + 1))
    return total, shared


def sharing(budget: int, seed: int) -> None:
    """What a memo or shared prefixes could save on this stream, at most (see the docstring)."""
    from simdist import sim
    from simdist.fuzz import checker as checker_mod
    from simdist.fuzz.compress import WARM_PERIODS, plan

    runs: list[tuple[int, ...]] = []
    cuts: list[tuple[int, ...]] = []
    warm: list[bool] = []
    sim_cpu, check_cpu, steady = [0.0], [0.0], [0]
    simulate, outcome, check = sim.simulate, checker_mod.Checker._outcome, checker_mod.Checker.check

    def timed_check(self: Any, *a: Any, **k: Any) -> Any:
        c = time.process_time()
        try:
            return check(self, *a, **k)
        finally:
            check_cpu[0] += time.process_time() - c

    def timed(*a: Any, **k: Any) -> Any:
        c = time.process_time()
        try:
            return simulate(*a, **k)
        finally:
            sim_cpu[0] += time.process_time() - c

    def recorded(self: Any, d: dict[str, Any], s: Any) -> Any:
        p = plan(s)
        if p.compressed:
            runs.append(p.compressed_counts)
            cuts.append(tuple(p.cuts()))
            warm.append(min(p.compressed_counts) >= p.threshold + WARM_PERIODS * p.period)
            # a stretch's first iteration is its transient; the rest are what a fast-forward could skip
            steady[0] += max(p.compressed_counts) - len(set(p.compressed_counts) - {0})
        return outcome(self, d, s)

    sim.simulate, checker_mod.Checker._outcome = timed, recorded  # type: ignore[method-assign]
    checker_mod.Checker.check = timed_check  # type: ignore[method-assign]
    try:
        res = measure_one(budget, seed, 1)
        setup, exit_ = _setup_and_exit(simulate)
    finally:
        sim.simulate, checker_mod.Checker._outcome = simulate, outcome  # type: ignore[method-assign]
        checker_mod.Checker.check = check  # type: ignore[method-assign]
    n, cpu, sims = res["schedules"], res["cpu"], res["compressed"] - res["reused"]
    total, shared = _shared_prefix(runs)
    per_iter = max(sim_cpu[0] - (setup + exit_) * sims, 0.0) / max(res["iterations_run"], 1)
    saved = setup * sims + per_iter * shared  # Join's exit comes after the divergence: never shared
    print(f"sharing: {n} schedules, {res['compressed']} compressed, exact memo (verdict_key) hits "
          f"{res['reused']} ({res['reused'] / max(res['compressed'], 1):.1%}); {cpu:.2f} s CPU, of which simulating "
          f"{sim_cpu[0]:.2f} s ({sim_cpu[0] / cpu:.0%}): set-up {setup * 1e3:.2f} ms + exit {exit_ * 1e3:.2f} ms a run, "
          f"{per_iter * 1e3:.2f} ms an iteration")
    print(f"sharing: iterations simulated {total}, in a prefix shared with an earlier schedule {shared} "
          f"({shared / max(total, 1):.1%}); schedules that share the set-up and the whole warm-up "
          f"{sum(warm)} of {len(warm)}")
    print(f"sharing: if every shared prefix and the set-up cost nothing: {n / (cpu - saved):.1f} schedules/s "
          f"CPU time ({n / (cpu - saved) / TARGET_RATE:.2f}x of the target; now {n / cpu:.1f}/s); if simulating cost "
          f"nothing at all: {n / (cpu - sim_cpu[0]):.1f}/s ({n / (cpu - sim_cpu[0]) / TARGET_RATE:.2f}x)")
    _ceilings(n, cpu, gen=cpu - check_cpu[0], saved=saved, ff=per_iter * steady[0], steady=steady[0], total=total,
              shared=shared)
    _relabelling_memos(runs, cuts)


def floor(budget: int, seed: int, reps: int) -> None:
    """The search with judging stubbed out, alternating with full searches (fresh processes)."""
    full, stub = [], []
    for _ in range(reps):
        full.append(_spawn(budget, seed, 1, None)["cpu"])
        stub.append(_spawn(budget, seed, 1, None, "--stub")["cpu"])
    n, f, s = budget, min(full), min(stub)
    left = 1e3 / TARGET_RATE - s / n * 1e3
    print(f"floor: full search {n / f:.1f} schedules/s CPU ({f / n * 1e3:.2f} ms a schedule; runs "
          f"{', '.join(f'{x:.2f}' for x in full)} s); without judging {n / s:.1f}/s ({s / n * 1e3:.2f} ms; runs "
          f"{', '.join(f'{x:.2f}' for x in stub)} s)")
    print(f"floor: judging takes {(f - s) / n * 1e3:.2f} ms a schedule; {TARGET_RATE:.0f}/s leaves it {left:.2f} ms "
          f"({(f - s) / n * 1e3 / max(left, 1e-9):.1f}x less than now)")


def _ir(budget: int, seed: int, code: str | None, *extra: str) -> int:
    """valgrind's count of the instructions (Ir) of one `--one --jobs 1` process, start-up included."""
    env = dict(os.environ, PYTHONHASHSEED="0")
    if code is not None:
        env["PYTHONPATH"] = str(Path(code).resolve()) + os.pathsep + env.get("PYTHONPATH", "")
    err = subprocess.run(["valgrind", "--tool=cachegrind", "--cache-sim=no", "--cachegrind-out-file=/dev/null",
                          sys.executable, os.path.abspath(__file__), "--one", "--budget", str(budget), "--seed",
                          str(seed), "--jobs", "1", *extra], env=env, check=True, capture_output=True, text=True).stderr
    return int(re.findall(r"I\s+refs:\s+([\d,]+)", err)[-1].replace(",", ""))


def instructions(budget: int, seed: int, baseline: str | None) -> None:
    """Instructions a schedule's judging executes: the search's count less the same search's with
    judging stubbed out (`--stub`; start-up and hypothesis cancel). Unlike CPU time the count does
    not move with the load (within about 1%), so a change of a few per cent shows on a loaded
    machine; but instructions are not time: the CPU-time figures are the target's."""
    codes = {"this": None} | ({"baseline": baseline} if baseline else {})
    judging = {}
    for label, code in codes.items():
        full, stub = _ir(budget, seed, code), _ir(budget, seed, code, "--stub")
        judging[label] = (full - stub) / budget
        print(f"instructions [{label}]: judging {judging[label] / 1e6:.2f} M a schedule ({budget} schedules, seed {seed}); "
              f"the process without judging {stub / 1e9:.2f} G (start-up included)", flush=True)
    if baseline:
        print(f"instructions: this / baseline, judging: {judging['baseline'] / judging['this']:.3f}x fewer")


def _stubbed_judge() -> None:
    """Every schedule passes without being planned, simulated or checked (--floor's other side)."""
    from simdist.fuzz import checker

    checker.Checker._outcome = lambda self, d, s: checker.Outcome(False, "ok", "ok", "no failure")  # type: ignore


def _setup_and_exit(simulate: Any, reps: int = 200) -> tuple[float, float]:
    """CPU seconds of a run's set-up (until the first rank enters Join's exit) and of the rest
    (Join's exit, the report), on the template with no inputs at all."""
    from simdist import simrank
    from simdist.fuzz.template import parse_template
    from simdist.program.actions import ExitJoin
    from simdist.scenario import parse_scenario

    s0 = parse_scenario(parse_template(TEMPLATE, source="bench").instantiate(_Zeros()), source="bench")
    mark: list[float] = []
    execute = simrank.SimRank.execute

    def marked(self: Any, a: Any) -> Any:
        if not mark and type(a) is ExitJoin:  # right after the rank enters the join_exit phase
            mark.append(time.process_time())
        return execute(self, a)

    simrank.SimRank.execute = marked  # type: ignore[method-assign]
    pre = post = 0.0
    try:
        for _ in range(reps):
            mark.clear()
            c0 = time.process_time()
            simulate(s0)
            c1 = time.process_time()
            pre, post = pre + mark[0] - c0, post + c1 - mark[0]
    finally:
        simrank.SimRank.execute = execute  # type: ignore[method-assign]
    return pre / reps, post / reps


def _ceilings(n: int, cpu: float, *, gen: float, saved: float, ff: float, steady: int, total: int,
              shared: int) -> None:
    """The rate each candidate of docs/fuzzing.md ("What would reach 500/s") would give at most:
    (1) a fast-forward inside a run, (2) free generation, (3) free shared prefixes and set-up."""
    _ceiling("(1) fast-forward inside compressed runs", f"{steady} of {total} iterations are not a stretch's "
             "first (the warm-up and unsettled gaps); skipping all of them", n, cpu, ff)
    _ceiling("(2) generation", f"{gen:.2f} s ({gen / n * 1e3:.2f} ms a schedule) outside the property "
             "(hypothesis, instantiating, validating); if it cost nothing", n, cpu, gen)
    _ceiling("(3) shared prefixes", "if every shared prefix and the set-up cost nothing", n, cpu, saved)
    _ceiling("(2)+(3)", "both free", n, cpu, gen + saved)
    _ceiling("(1)+(2)+(3)", "all three free (the fast-forward on the unshared part only)", n, cpu,
             gen + saved + ff * (1 - shared / max(total, 1)))


def _ceiling(label: str, what: str, n: int, cpu: float, saved: float) -> None:
    rate = n / max(cpu - saved, 1e-9)
    print(f"ceiling {label}: {what}: {rate:.1f} schedules/s ({rate / TARGET_RATE:.2f}x of the target)")


def _relabelling_memos(runs: list[tuple[int, ...]], cuts: list[tuple[int, ...]]) -> None:
    """Hits of a verdict memo keyed by the compressed counts and cuts (the template's other fields
    are fixed here: `verdict_key`), and by the counts up to a relabelling of ranks: of ranks 3-6
    (no ZeRO shard, no root, not the highest rank), or of all ranks (not sound for this template)."""
    keys = {"exact (verdict_key, one memo for all shards)": lambda c: c, "ranks 3-6 relabelled": lambda c: c[:3] + tuple(sorted(c[3:7])) + c[7:],
            "any relabelling (not sound here)": lambda c: tuple(sorted(c))}
    for label, f in keys.items():
        seen: set[tuple[tuple[int, ...], tuple[int, ...]]] = set()
        hits = 0
        for c, k in zip(runs, cuts, strict=True):
            hits += (f(c), k) in seen
            seen.add((f(c), k))
        print(f"sharing: a verdict memo over compressed counts, {label}: {hits} hits of {len(runs)}")


class _Zeros:
    """A template `Chooser` that draws every range's low end (no inputs: set-up and exit only)."""

    def integer(self, lo: int, hi: int) -> int:
        return lo

    def floating(self, lo: float, hi: float) -> float:
        return lo

    def index(self, n: int) -> int:
        return 0

    def flag(self) -> bool:
        return False

    def subset(self, items: list[int]) -> list[int]:
        return items[:1]


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--budget", type=int, default=1000, help="examples per run (10 shards of 100 by default)")
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--reps", type=int, default=2, help="runs of each --jobs value (the best is kept)")
    ap.add_argument("--jobs", type=int, default=2, help="the parallel run's worker processes")
    ap.add_argument("--baseline", metavar="DIR", help="also measure the simdist in DIR (alternating with this one)")
    ap.add_argument("--profile", action="store_true", help="profile one --jobs 1 run and print the top functions")
    ap.add_argument("--no-compress", action="store_true", help="also measure --jobs 1 without schedule compression")
    ap.add_argument("--sharing", action="store_true",
                    help="only measure how much a memo or shared prefixes could save on this stream, at most")
    ap.add_argument("--floor", action="store_true",
                    help="only measure the search without judging schedules, against the full search")
    ap.add_argument("--pairs", type=int, metavar="N",
                    help="only run N pairs of --jobs 1 searches, this checkout and --baseline side by side")
    ap.add_argument("--instructions", action="store_true",
                    help="only count (valgrind) the instructions of judging a schedule, this checkout's and "
                         "--baseline's: a figure the machine's load does not move")
    ap.add_argument("--one", action="store_true", help=argparse.SUPPRESS)  # a measurement process
    ap.add_argument("--stub", action="store_true", help=argparse.SUPPRESS)  # ... with judging stubbed out
    args = ap.parse_args()
    if args.stub:
        _stubbed_judge()
    if args.one:
        print(json.dumps(measure_one(args.budget, args.seed, args.jobs)))
        return
    if args.sharing:
        sharing(args.budget, args.seed)
        return
    if args.floor:
        floor(args.budget, args.seed, args.reps)
        return
    if args.instructions:
        instructions(args.budget, args.seed, args.baseline)
        return
    if args.pairs:
        if not args.baseline:
            ap.error("--pairs needs --baseline DIR")
        pairs(args.budget, args.seed, args.pairs, args.baseline)
        return

    print(f"template: 8 ranks, inputs 0-100 per rank, DDP (3 buckets) + ZeRO under Join; budget {args.budget}, "
          f"seed {args.seed}, best of {args.reps}")
    print(f"before: {_load()}")
    codes = {"this": None} | ({"baseline": args.baseline} if args.baseline else {})
    runs: dict[tuple[str, int], list[dict[str, Any]]] = {}
    for _ in range(args.reps):
        for label, code in codes.items():
            for jobs in (1, args.jobs):
                runs.setdefault((label, jobs), []).append(_spawn(args.budget, args.seed, jobs, code))
    print(f"after:  {_load()}")
    for label in codes:
        _report(label, runs[(label, 1)], runs[(label, args.jobs)], args.jobs)
    if args.baseline:
        a, b = _best(runs[("this", 1)], "cpu"), _best(runs[("baseline", 1)], "cpu")
        print(f"this / baseline, --jobs 1 CPU time: {b['cpu'] / a['cpu']:.2f}x faster")

    if args.no_compress:
        res = measure_one(args.budget, args.seed, 1, compress=False)
        one = _best(runs[("this", 1)], "cpu")
        print(f"--jobs 1 --no-compress: {res['schedules'] / res['cpu']:.1f} schedules/s CPU time -> compression "
              f"speed-up {res['cpu'] / one['cpu']:.1f}x")
    if args.profile:
        prof = cProfile.Profile(time.process_time)
        prof.enable()
        measure_one(args.budget, args.seed, 1)
        prof.disable()
        buf = io.StringIO()
        pstats.Stats(prof, stream=buf).sort_stats("tottime").print_stats(25)
        print(buf.getvalue())


if __name__ == "__main__":
    main()
