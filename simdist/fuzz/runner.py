"""The fuzz loop: hypothesis drives the template, the simulator and checker judge each schedule.

Property: the run completes, the engine found no (silent) mismatch, and the loop's
semantic invariants hold (`simdist.check.classify`). Every failure class (root-cause kind +
outcome) is a distinct hypothesis bug: each is shrunk separately, then a greedy pass drops
ranks, steps and inputs while the same class still fails, and the result is written as a
plain scenario file (stable name: a hash of its content) that replays bit for bit with
`simdist run` and on the real backend with `simdist real` / `simdist compare`.
"""

from __future__ import annotations

import re
import threading
import time
import warnings
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase
from hypothesis.errors import HypothesisWarning, Unsatisfiable

from simdist.check.classify import check_run
from simdist.check.explain import explain_verdict
from simdist.errors import InputError, ScenarioError
from simdist.fuzz.compress import passes_compressed
from simdist.fuzz.compress import plan as compress_plan
from simdist.fuzz.counterexample import canonical, write_counterexample
from simdist.fuzz.shrink import greedy_shrink
from simdist.fuzz.strategies import template_scenarios
from simdist.fuzz.template import Template
from simdist.procs import interrupt_event
from simdist.scenario import Scenario, parse_scenario
from simdist.sim import simulate

# Health checks switched off, each for a reason; the others stay on:
SUPPRESSED_HEALTH_CHECKS = [
    # A template's instances may be rejected by the scenario schema (a subset naming a rank
    # that the drawn world lacks, a step valid only for some world sizes): those draws are
    # discarded with assume(), and a template that rejects many is still a valid search.
    # (Every other check stays on: drawing an example only instantiates and validates a
    # scenario, milliseconds; the simulation runs in the test body, which they do not time.)
    HealthCheck.filter_too_much,
]


class FuzzFailure(AssertionError):
    """Raised by the property; one subclass per failure class so hypothesis shrinks each separately."""

    key = ""


_CLASSES: dict[str, type[FuzzFailure]] = {}


def failure_class(key: str) -> type[FuzzFailure]:
    cls = _CLASSES.get(key)
    if cls is None:
        cls = type("FuzzFailure_" + re.sub(r"\W", "_", key), (FuzzFailure,), {"key": key})
        _CLASSES[key] = cls
    return cls


@dataclass
class Outcome:
    """What one schedule did, as much as the fuzzer keeps (the report itself is not cached)."""

    failed: bool
    key: str  # failure class: "<kind>/<outcome>"; "ok" when it passed
    signature: str
    summary: str


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
    first_failure_at: int | None = None  # generation example number of the first failure
    compress: bool = True  # schedules judged on their compressed form (simdist.fuzz.compress)
    compressed: int = 0  # schedules that were compressed
    resimulated: int = 0  # compressed schedules re-simulated in full (failed, or ranks out of step)
    iterations_full: int = 0  # sum of the schedules' largest input counts
    iterations_run: int = 0  # sum of the largest input counts simulated (compressed + full re-runs)
    expect: str | None = None  # the template's [fuzz].expect: "failure", "ok" or None (= "ok")

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


class Checker:
    """Simulates and checks schedules, with a cache keyed by the concrete scenario.

    With `compress` (the default) a schedule is first judged on its compressed form
    (`simdist.fuzz.compress`: the steady middle of every gap between distinct input counts
    removed). A pass of a run whose ranks stayed in step is final; anything else (a failure,
    or ranks out of step) is re-simulated in full, so every failure class, signature and
    summary the fuzzer reports, shrinks on and writes is the full schedule's own.
    """

    def __init__(self, template: Template, compress: bool = True):
        self.template = template
        self.compress = compress
        self.cache: dict[str, Outcome] = {}
        self.simulated = 0
        self.compressed = 0  # schedules judged on a compressed run
        self.resimulated = 0  # of those, re-simulated in full (failed, or ranks out of step)
        self.iterations_full = 0  # sum over schedules of the full schedule's max input count
        self.iterations_run = 0  # ... and of the max input count actually simulated

    def _judge(self, s: Scenario) -> Outcome:
        v = check_run(simulate(s), s, invariants=self.template.invariants)
        return Outcome(v.failed, f"{v.kind}/{v.outcome}" if v.failed else "ok", v.signature, v.summary)

    def check(self, d: dict[str, Any], s: Scenario | None = None) -> Outcome | None:
        """None when `d` is not a valid scenario."""
        k = canonical(d)
        hit = self.cache.get(k)
        if hit is not None:
            return hit
        if s is None:
            try:
                s = parse_scenario(d, source=self.template.source)
            except ScenarioError:
                return None
        full = max(s.counts(), default=0)
        self.iterations_full += full
        p = compress_plan(s) if self.compress else None
        if p is not None and p.compressed:
            self.compressed += 1
            self.iterations_run += max(p.compressed_counts, default=0)
            if passes_compressed(s, p, invariants=self.template.invariants):
                out = Outcome(False, "ok", "ok", "no failure")
            else:  # failed, or ranks out of step: judge the full schedule (exact class, signature, summary)
                self.resimulated += 1
                self.iterations_run += full
                out = self._judge(s)
        else:
            self.iterations_run += full
            out = self._judge(s)
        self.simulated += 1
        self.cache[k] = out
        return out


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
) -> FuzzResult:
    """Fuzz one template; returns counts and the written counterexamples (none when it holds).

    Every file goes under `out_dir` (names made safe: `counterexample.safe_name`). A failure
    class is written the moment it is first found, and replaced by its shrunk form when the
    search ends; on Ctrl-C the smallest failing schedule of each class found so far is
    written and `FuzzInterrupted` raised. `compress=False` simulates every schedule in full
    (see `Checker`)."""
    budget = template.budget if budget is None else budget
    res = FuzzResult(template=template.name, source=template.source, seed=seed, budget=budget, compress=compress,
                     expect=template.expect)
    checker = Checker(template, compress=compress)
    files = _Files(template, seed, Path(out_dir) if out_dir is not None else None, res)
    search = _Search(template, checker, res, on_example, files)
    db = None
    if use_db:
        db_path = Path(db_dir) if db_dir is not None else Path(out_dir or ".") / ".examples"
        # one database per template (and version of it): hypothesis keys saved examples by the
        # property function, which is the same for every template
        db = DirectoryBasedExampleDatabase(str(db_path / f"{template.name}-{template.digest[:12]}"))
    t0 = time.perf_counter()
    # Ctrl-C (and SIGTERM) set an event that the search checks between schedules: a
    # KeyboardInterrupt raised wherever the signal lands can be lost (hypothesis runs code in
    # garbage-collector callbacks, where Python only prints "Exception ignored"). A second one
    # raises at once, for a schedule that takes long.
    try:
        with interrupt_event(twice_raises=True) as search.stop:
            keys = search.run(budget, seed, db, shrink)
            files.raise_if_failed()
            search.phase = "post-shrink"
            for key in keys:
                d = search.last_failing[key]
                if shrink:
                    d = greedy_shrink(d, key, checker, tick=search.tick)
                res.counterexamples.append(files.write(key, d, "shrunk"))
            search.tick_stop()
    except KeyboardInterrupt:
        done = {c.key for c in res.counterexamples}
        for key, d in search.last_failing.items():
            if key not in done:
                res.counterexamples.append(files.write(key, d, "interrupted"))
        _finish(res, checker, t0)
        raise FuzzInterrupted(res) from None
    _finish(res, checker, t0)
    return res


def _finish(res: FuzzResult, checker: Checker, t0: float) -> None:
    res.schedules = checker.simulated
    res.compressed = checker.compressed
    res.resimulated = checker.resimulated
    res.iterations_full = checker.iterations_full
    res.iterations_run = checker.iterations_run
    res.seconds = time.perf_counter() - t0


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
        """Called inside the property: an error must not become a hypothesis failure."""
        try:
            self.write(key, d, "unshrunk")
        except OSError as e:
            self.error = self.error or e

    def raise_if_failed(self) -> None:
        if self.error is not None:
            raise InputError(f"--out: cannot write counterexamples in {self.out_dir} ({self.error.strerror or self.error})")


class _Search:
    """The hypothesis search over one template: the property, its bookkeeping, and the run."""

    def __init__(self, template: Template, checker: Checker, res: FuzzResult,
                 on_example: Callable[[int, str], None] | None, files: _Files):
        self.template, self.checker, self.res, self.on_example = template, checker, res, on_example
        self.files = files
        self.stop: threading.Event | None = None  # set by Ctrl-C (fuzz_template)
        self.phase = "generate"
        self.generated = 0
        self.counted: set[str] = set()  # failing schedules already counted in res.failures
        self.last_failing: dict[str, dict[str, Any]] = {}  # failure class -> its last failing schedule

    def tick_stop(self) -> None:
        """Raise KeyboardInterrupt here, at a safe point, when Ctrl-C was pressed."""
        if self.stop is not None and self.stop.is_set():
            raise KeyboardInterrupt

    def tick(self) -> None:
        self.tick_stop()
        self.res.examples += 1
        if self.on_example is not None:
            self.on_example(self.res.examples, self.phase)

    def check(self, pair: tuple[dict[str, Any], Scenario]) -> None:
        """The property: raises the failure's own class when the schedule fails."""
        d, s = pair
        if self.phase == "generate":
            self.generated += 1
        self.tick()
        k = canonical(d)
        new = k not in self.checker.cache
        o = self.checker.check(d, s)
        assert o is not None
        if o.failed:
            res = self.res
            if new and k not in self.counted:
                self.counted.add(k)
                res.failures[o.signature] = res.failures.get(o.signature, 0) + 1
            first = o.key not in res.classes
            res.classes.setdefault(o.key, self.checker.simulated)
            if res.first_failure_at is None:
                res.first_failure_at = self.generated
            self.phase = "shrink"
            self.last_failing[o.key] = d
            if first:
                self.files.first_found(o.key, d)
            raise failure_class(o.key)(o.summary)

    def run(self, budget: int, seed: int, db: DirectoryBasedExampleDatabase | None, shrink: bool) -> list[str]:
        """Run hypothesis; the failure classes found (each shrunk by hypothesis), in order."""
        phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target] + ([Phase.shrink] if shrink else [])
        test = hypothesis_seed(seed)(given(template_scenarios(self.template))(self.check))
        # settings go on last: hypothesis.seed() switches the example database off (it is meant
        # for replaying one run), and a settings decorator applied after it decides the database
        # again. We want both: a reproducible search that still starts from saved failures.
        prop = settings(max_examples=budget, database=db, deadline=None, derandomize=False, phases=phases,
                        suppress_health_check=SUPPRESSED_HEALTH_CHECKS, report_multiple_bugs=True,
                        verbosity=Verbosity.quiet, print_blob=False)(test)
        raised: list[BaseException] = []
        try:
            with warnings.catch_warnings():  # hypothesis's notes on its own reprs are not the user's news
                warnings.simplefilter("ignore", HypothesisWarning)
                prop()
        except FuzzFailure as e:
            raised = [e]
        except Unsatisfiable:
            raise ScenarioError(f"{self.template.source}: the template yields no valid scenario (every instance was "
                                "rejected by the schema)") from None
        except Exception as eg:  # an ExceptionGroup: several failure classes, each shrunk
            if not hasattr(eg, "exceptions"):
                raise
            raised = list(eg.exceptions)
        keys: list[str] = []
        for e in raised:
            if not isinstance(e, FuzzFailure):
                raise e
            if e.key not in keys:
                keys.append(e.key)
        return keys


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
        path = str(write_counterexample(d, template, seed, Path(out_dir), expl, f"{v.kind}/{v.outcome}", v.summary,
                                        expect, state))
    return Counterexample(key=key, signature=v.signature, summary=v.summary, scenario=d, path=path,
                          found_at=found_at, world_size=s.world_size, counts=s.counts(),
                          steps=len(s.loop) + len(s.after), explanation=expl)
