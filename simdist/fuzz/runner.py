"""The fuzz loop: hypothesis drives the template, the simulator and checker judge each schedule.

Property: the run completes, the engine found no (silent) mismatch, and the loop's
semantic invariants hold (`simdist.check.classify`). Every failure class (root-cause kind +
outcome) is a distinct hypothesis bug: each is shrunk separately, then a greedy pass drops
ranks, steps and inputs while the same class still fails, and the result is written as a
plain scenario file (stable name: a hash of its content) that replays bit for bit with
`simdist run` and on the real backend with `simdist real` / `simdist compare`.

The search is a campaign of shards (`simdist.fuzz.campaign`): ``jobs`` worker processes, or
a Dask cluster (`executor`), run them; the same seed gives the same answer on any of them.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis.database import DirectoryBasedExampleDatabase

from simdist.check.classify import check_run
from simdist.check.explain import explain_verdict
from simdist.errors import InputError
from simdist.fuzz.campaign import SHARD_SIZE, CampaignResult, Executor, InProcess, LocalPool, plan_shards, run_campaign
from simdist.fuzz.checker import Checker
from simdist.fuzz.counterexample import safe_name, write_counterexample
from simdist.fuzz.search import SUPPRESSED_HEALTH_CHECKS, ShardResult, apply_ops, snapshot_database
from simdist.fuzz.shrink import greedy_shrink
from simdist.fuzz.template import Template
from simdist.procs import interrupt_event
from simdist.scenario import parse_scenario
from simdist.sim import simulate

__all__ = ["SUPPRESSED_HEALTH_CHECKS", "Counterexample", "FuzzInterrupted", "FuzzResult", "fuzz_template"]


@dataclass
class Counterexample:
    key: str
    signature: str
    summary: str
    scenario: dict[str, Any]
    path: str | None
    found_at: int  # schedule number at which this class was first seen
    world_size: int
    counts: list[int]
    steps: int
    explanation: list[str] = field(default_factory=list)


@dataclass
class FuzzResult:
    """One template's search: how much was tried, the distinct failures, the counterexamples."""

    template: str
    source: str
    seed: int
    budget: int
    examples: int = 0  # property evaluations (generation + shrinking), cache hits included
    schedules: int = 0  # distinct schedules simulated and checked
    failures: dict[str, int] = field(default_factory=dict)  # signature -> failing schedules
    classes: dict[str, int] = field(default_factory=dict)  # class key -> first schedule number
    counterexamples: list[Counterexample] = field(default_factory=list)
    seconds: float = 0.0
    # CPU time of the shards (all processes), and of the busiest process's shards: on idle
    # cores the search takes about that long, whatever else the machine is doing now
    cpu_seconds: float = 0.0
    cpu_busiest: float = 0.0
    first_failure_at: int | None = None  # generation example number of the first failure
    compress: bool = True  # schedules judged on their compressed form (simdist.fuzz.compress)
    compressed: int = 0  # schedules that were compressed
    resimulated: int = 0  # compressed schedules re-simulated in full (failed, or ranks out of step)
    reused: int = 0  # compressed schedules whose compressed run was already judged (same verdict_key)
    iterations_full: int = 0  # sum of the schedules' largest input counts
    iterations_run: int = 0  # sum of the largest input counts simulated (compressed + full re-runs)
    expect: str | None = None  # the template's [fuzz].expect: "failure", "ok" or None (= "ok")
    jobs: int = 1  # processes that ran shards (1: this one; a cluster: its workers); the answer does not depend on it
    shards: int = 1  # shards of the campaign that count (up to the first failing one)
    shard_size: int = SHARD_SIZE

    @property
    def failed(self) -> bool:
        return bool(self.counterexamples) or bool(self.failures)

    @property
    def as_expected(self) -> bool:
        """Did the search end as the template says: a failure found for ``expect = "failure"``
        (a deadlock-family template), none for ``"ok"`` or no expectation? The CLI exits on it."""
        return self.failed if self.expect == "failure" else not self.failed

    @property
    def rate(self) -> float:
        return self.schedules / self.seconds if self.seconds > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        from dataclasses import asdict

        d = asdict(self)
        d["failed"] = self.failed
        d["as_expected"] = self.as_expected
        d["schedules_per_second"] = round(self.rate, 2)
        d["distinct_failures"] = len(self.failures)
        return d


# ---------------------------------------------------------------------------- the loop
class FuzzInterrupted(KeyboardInterrupt):
    """Ctrl-C during a search. What it had found is written (`result.counterexamples`, each
    the smallest failing schedule of its class seen so far) before this is raised."""

    def __init__(self, result: FuzzResult):
        super().__init__("fuzzing interrupted")
        self.result = result


def fuzz_template(
    template: Template,
    *,
    budget: int | None = None,
    seed: int = 0,
    out_dir: str | Path | None = "failures",
    db_dir: str | Path | None = None,
    use_db: bool = True,
    shrink: bool = True,
    on_example: Callable[[int, str], None] | None = None,
    compress: bool = True,
    jobs: int = 1,
    executor: Executor | None = None,
    shard_size: int = SHARD_SIZE,
) -> FuzzResult:
    """Fuzz one template; returns counts and the written counterexamples (none when it holds).

    The budget is split into shards of `shard_size` examples (`simdist.fuzz.campaign`), run
    here (`jobs=1`), on `jobs` local worker processes, or on `executor` (e.g. a
    `simdist.fuzz.cluster.DaskExecutor`, which the caller closes); the answer depends on the
    seed, budget and shard size only. Every file goes under `out_dir` (names made safe:
    `counterexample.safe_name`). A failure class is written the moment it is first found (a
    worker's find as the worker reports it), and replaced by its shrunk form when the search
    ends; on Ctrl-C the smallest failing schedule of each class found so far is written and
    `FuzzInterrupted` raised. `compress=False` simulates every schedule in full (see
    `simdist.fuzz.checker.Checker`)."""
    budget = template.budget if budget is None else budget
    res = FuzzResult(template=template.name, source=template.source, seed=seed, budget=budget, compress=compress,
                     expect=template.expect, jobs=jobs, shard_size=shard_size)
    db, replay = _open_database(template, out_dir, db_dir) if use_db else (None, None)
    specs = plan_shards(budget, seed, shard_size, shrink=shrink, compress=compress, use_db=use_db, replay=replay)
    files = _Files(template, seed, Path(out_dir) if out_dir is not None else None, res)
    own = executor is None
    if executor is None:
        executor = InProcess(on_example) if jobs <= 1 else LocalPool(jobs)
    res.jobs = executor.jobs
    t0 = time.perf_counter()
    camp = CampaignResult()
    # Ctrl-C (and SIGTERM) set an event that the shards poll between schedules: a
    # KeyboardInterrupt raised wherever the signal lands can be lost (hypothesis runs code in
    # garbage-collector callbacks, where Python only prints "Exception ignored"). A second one
    # raises at once, for a schedule that takes long.
    try:
        with interrupt_event(twice_raises=True) as stop:
            try:
                camp = run_campaign(template, specs, executor, on_found=lambda _i, k, d: files.first_found(k, d),
                                    on_shard=_progress(on_example, executor), stop=stop)
            finally:
                if own:
                    executor.close()
            _merge(res, camp)
            if db is not None:
                for r in camp.shards:
                    apply_ops(db, r.db_ops)
            files.raise_if_failed()
            if camp.interrupted:
                raise KeyboardInterrupt
            checker = Checker(template, compress=compress)  # the greedy pass's own judge (its schedules count too)
            for key in _keys(camp.shards):
                d = _smallest(camp.shards, key)
                if shrink:
                    d = greedy_shrink(d, key, checker, tick=lambda: _tick(res, on_example, stop))
                res.counterexamples.append(files.write(key, d, "shrunk"))
            res.schedules += checker.simulated
            files.keep_only(_keys(camp.shards))  # files of failures in shards after the answer's last one
    except KeyboardInterrupt:
        done = {c.key for c in res.counterexamples}
        for key in _keys(camp.shards):
            if key not in done:
                res.counterexamples.append(files.write(key, _smallest(camp.shards, key), "interrupted"))
        res.seconds = time.perf_counter() - t0
        raise FuzzInterrupted(res) from None
    res.seconds = time.perf_counter() - t0
    return res


def _open_database(template: Template, out_dir: str | Path | None,
                   db_dir: str | Path | None) -> tuple[DirectoryBasedExampleDatabase, dict[str, bytes]]:
    """The template's example database and a snapshot of it for the shards to replay.

    One database per template (and version of it): hypothesis keys saved examples by the
    property function, which is the same for every template."""
    db_path = Path(db_dir) if db_dir is not None else Path(out_dir or ".") / ".examples"
    folder = db_path / f"{safe_name(template.name)}-{template.digest[:12]}"  # a name that stays inside db_path
    replay = snapshot_database(folder)  # before the database object touches the folder
    return DirectoryBasedExampleDatabase(str(folder)), replay


def _progress(on_example: Callable[[int, str], None] | None, executor: Executor) -> Callable[[ShardResult], None] | None:
    """Workers report a shard when it ends (`InProcess` reports every example itself)."""
    if on_example is None or isinstance(executor, InProcess):
        return None
    total = [0]

    def on_shard(r: ShardResult) -> None:
        total[0] += r.generated
        on_example(total[0], "generate" if not r.failed else "shrink")

    return on_shard


def _tick(res: FuzzResult, on_example: Callable[[int, str], None] | None, stop: threading.Event) -> None:
    if stop.is_set():  # Ctrl-C, seen between two schedules of the greedy pass
        raise KeyboardInterrupt
    res.examples += 1
    if on_example is not None:
        on_example(res.examples, "post-shrink")


def _merge(res: FuzzResult, camp: CampaignResult) -> None:
    """Add up the shards in order: counts, failures by signature, and each failure class's
    first sighting as a schedule number of the whole campaign."""
    generated = schedules = 0
    per_worker: dict[int, float] = {}
    for r in camp.shards:
        per_worker[r.worker] = per_worker.get(r.worker, 0.0) + r.cpu_seconds
        for sig, n in r.failures.items():
            res.failures[sig] = res.failures.get(sig, 0) + n
        for key, at in r.classes.items():
            res.classes.setdefault(key, schedules + at)
        if res.first_failure_at is None and r.first_failure_at is not None:
            res.first_failure_at = generated + r.first_failure_at
        generated += r.generated
        schedules += r.schedules
        res.examples += r.examples
        res.compressed += r.compressed
        res.resimulated += r.resimulated
        res.reused += r.reused
        res.iterations_full += r.iterations_full
        res.iterations_run += r.iterations_run
    res.schedules = schedules
    res.shards = len(camp.shards)
    res.cpu_seconds = sum(per_worker.values())
    res.cpu_busiest = max(per_worker.values(), default=0.0)


def _keys(shards: list[ShardResult]) -> list[str]:
    keys: list[str] = []
    for r in shards:
        keys += [k for k in r.keys if k not in keys]
    return keys


def _smallest(shards: list[ShardResult], key: str) -> dict[str, Any]:
    """A class's schedule from the first shard (in order) that found it."""
    return next(r.found[key] for r in shards if key in r.found)


class _Files:
    """The counterexample file of each failure class: written when the class is first found,
    replaced by a smaller schedule later (the older file removed)."""

    def __init__(self, template: Template, seed: int, out_dir: Path | None, res: FuzzResult):
        self.template, self.seed, self.out_dir, self.res = template, seed, out_dir, res
        self.paths: dict[str, Path] = {}
        self.error: OSError | None = None  # a write that failed inside the search

    def write(self, key: str, d: dict[str, Any], state: str) -> Counterexample:
        c = _counterexample(d, key, self.template, self.seed, self.out_dir, self.res.classes.get(key, 0), state)
        old = self.paths.get(key)
        if c.path is not None:
            self.paths[key] = Path(c.path)
            if old is not None and old != Path(c.path):
                old.unlink(missing_ok=True)
        return c

    def first_found(self, key: str, d: dict[str, Any]) -> None:
        """Called inside the property (or as a worker reports it): an error must not become a
        hypothesis failure."""
        try:
            self.write(key, d, "unshrunk")
        except OSError as e:
            self.error = self.error or e

    def keep_only(self, keys: list[str]) -> None:
        """Remove the early files of classes that are not part of the answer: a later shard
        found them before an earlier shard's failure made it the last one read."""
        for key, path in list(self.paths.items()):
            if key not in keys:
                path.unlink(missing_ok=True)
                del self.paths[key]

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise InputError(f"--out: cannot write counterexamples in {self.out_dir} ({self.error.strerror or self.error})")


def _counterexample(d: dict[str, Any], key: str, template: Template, seed: int, out_dir: str | Path | None,
                    found_at: int, state: str = "shrunk") -> Counterexample:
    """Judge the (shrunk) schedule once more, explain it, and write it when `out_dir` is set."""
    s = parse_scenario(d, source=template.source)
    report = simulate(s)
    v = check_run(report, s, invariants=template.invariants)
    expl = explain_verdict(report, s, v)
    expect = {"outcome": report.outcome, "inputs_processed": [r.inputs_processed for r in report.ranks],
              "status": [r.status for r in report.ranks]}
    path = None
    if out_dir is not None:
        try:
            path = str(write_counterexample(d, template, seed, Path(out_dir), expl, f"{v.kind}/{v.outcome}",
                                            v.summary, expect, state))
        except OSError as e:  # the CLI checks --out first; the API meets it here
            raise InputError(f"--out: cannot write counterexamples in {out_dir} ({e.strerror or e})") from None
    return Counterexample(key=key, signature=v.signature, summary=v.summary, scenario=d, path=path,
                          found_at=found_at, world_size=s.world_size, counts=s.counts(),
                          steps=len(s.loop) + len(s.after), explanation=expl)
