"""One shard of a fuzz campaign: a hypothesis search of `budget` examples from its own seed.

A campaign (`simdist.fuzz.campaign`) splits its budget into shards whose number and seeds
depend only on the budget, the seed and the shard size, never on how many processes or
machines run them; a shard is a pure function of (template, `ShardSpec`), so the same seed
finds the same failures with ``--jobs 1``, ``--jobs 8`` or a Dask cluster. That is why a
shard never writes anything itself: it reports what it found (`ShardResult.found`, each
failure class shrunk by hypothesis) and logs what it would have written to the example
database (`RecordingDatabase`); the campaign writes files and applies the log, in shard
order, so nothing a shard reads changes while shards run.

Property: the run completes, the engine found no (silent) mismatch, and the loop's
semantic invariants hold (`simdist.check.classify`). Every failure class (root-cause kind +
outcome) is a distinct hypothesis bug, each shrunk separately.
"""

from __future__ import annotations

import contextlib
import os
import re
import tempfile
import time
import warnings
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis.database import DirectoryBasedExampleDatabase, ExampleDatabase
from hypothesis.errors import HypothesisWarning, Unsatisfiable

from simdist.errors import ScenarioError
from simdist.fuzz.checker import Checker
from simdist.fuzz.counterexample import canonical
from simdist.fuzz.strategies import template_scenarios
from simdist.fuzz.template import Template
from simdist.scenario import Scenario

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


class ShardStopped(KeyboardInterrupt):
    """Raised between two examples when the shard should stop (Ctrl-C, or an earlier shard
    failed so this one's result will not be used). A KeyboardInterrupt, because hypothesis
    lets exactly that through at once, without shrinking or saving anything."""


# ---------------------------------------------------------------------------- database
DbOp = tuple[str, bytes, bytes]  # ("save" | "delete", key, value)


def snapshot_database(path: Path) -> dict[str, bytes]:
    """Every file of an example-database folder, by relative path: what shard 0 replays.

    Shipping the files (not the path) lets a shard run where the folder is not (a Dask
    worker on another machine), and keeps hypothesis's own folder layout opaque to us."""
    if not path.is_dir():
        return {}
    return {str(p.relative_to(path)): p.read_bytes() for p in sorted(path.rglob("*")) if p.is_file()}


class RecordingDatabase(ExampleDatabase):
    """What a shard's hypothesis run sees as its database: the saved examples of the campaign's
    start (`source`, read only) plus its own writes, which are also logged in `ops` for the
    campaign to apply to the real database afterwards."""

    def __init__(self, source: ExampleDatabase | None = None):
        super().__init__()
        self.source = source
        self.mine: dict[bytes, dict[bytes, None]] = {}  # insertion-ordered sets
        self.deleted: set[tuple[bytes, bytes]] = set()
        self.ops: list[DbOp] = []

    def fetch(self, key: bytes) -> Iterable[bytes]:
        own = self.mine.get(key, {})
        if self.source is not None:
            for v in self.source.fetch(key):
                if (key, v) not in self.deleted and v not in own:
                    yield v
        yield from list(own)

    def save(self, key: bytes, value: bytes) -> None:
        value = bytes(value)
        self.mine.setdefault(key, {})[value] = None
        self.deleted.discard((key, value))
        self.ops.append(("save", key, value))

    def delete(self, key: bytes, value: bytes) -> None:
        value = bytes(value)
        self.mine.get(key, {}).pop(value, None)
        self.deleted.add((key, value))
        self.ops.append(("delete", key, value))


def apply_ops(db: ExampleDatabase, ops: Iterable[DbOp]) -> None:
    for op, key, value in ops:
        if op == "save":
            db.save(key, value)
        else:
            db.delete(key, value)


# ---------------------------------------------------------------------------- one shard
@dataclass(frozen=True)
class ShardSpec:
    """One shard: its place in the campaign, its seed and budget, and what it replays."""

    index: int
    seed: int
    budget: int
    shrink: bool = True
    compress: bool = True
    use_db: bool = False  # record database writes (and, with `replay`, read the saved examples)
    replay: dict[str, bytes] | None = None  # the database folder's files (shard 0 only)


@dataclass
class ShardResult:
    """What one shard did; the campaign adds these up in shard order."""

    index: int
    examples: int = 0  # property evaluations (generation + shrinking), cache hits included
    generated: int = 0  # of those, in the generation phases
    schedules: int = 0  # distinct schedules simulated and checked
    compressed: int = 0
    resimulated: int = 0
    reused: int = 0  # compressed schedules judged by a compressed run already simulated (Checker.verdicts)
    iterations_full: int = 0
    iterations_run: int = 0
    failures: dict[str, int] = field(default_factory=dict)  # signature -> failing schedules
    classes: dict[str, int] = field(default_factory=dict)  # class key -> schedule number (in this shard)
    first_failure_at: int | None = None  # generation example number (in this shard)
    keys: list[str] = field(default_factory=list)  # failure classes hypothesis reported, in order
    found: dict[str, dict[str, Any]] = field(default_factory=dict)  # class key -> its smallest failing schedule
    db_ops: list[DbOp] = field(default_factory=list)
    stopped: bool = False  # interrupted before the end (what it found so far is in `found`)
    seconds: float = 0.0
    cpu_seconds: float = 0.0  # CPU time of the process that ran it, while it ran (wall means little on a shared machine)
    worker: int = 0  # that process's pid: which shards shared a core

    @property
    def failed(self) -> bool:
        return bool(self.found)


Found = Callable[[str, dict[str, Any]], None]  # (failure class, schedule): a class seen for the first time


class _Search:
    """The hypothesis search of one shard: the property and its bookkeeping."""

    def __init__(self, template: Template, spec: ShardSpec, stop: Callable[[], bool] | None,
                 on_found: Found | None, on_example: Callable[[int, str], None] | None):
        self.template, self.spec, self.stop = template, spec, stop
        self.on_found, self.on_example = on_found, on_example
        self.checker = Checker(template, compress=spec.compress)
        self.res = ShardResult(index=spec.index)
        self.phase = "generate"
        self.counted: set[str] = set()  # failing schedules already counted in res.failures

    def tick(self) -> None:
        if self.stop is not None and self.stop():
            raise ShardStopped
        self.res.examples += 1
        if self.on_example is not None:
            self.on_example(self.res.examples, self.phase)

    def check(self, pair: tuple[dict[str, Any], Scenario]) -> None:
        """The property: raises the failure's own class when the schedule fails."""
        d, s = pair
        self.tick()
        if self.phase == "generate":
            self.res.generated += 1
        k = canonical(d)
        new = k not in self.checker.cache
        o = self.checker.check(d, s, k)
        assert o is not None
        if o.failed:
            res = self.res
            if new and k not in self.counted:
                self.counted.add(k)
                res.failures[o.signature] = res.failures.get(o.signature, 0) + 1
            first = o.key not in res.classes
            res.classes.setdefault(o.key, self.checker.simulated)
            if res.first_failure_at is None:
                res.first_failure_at = res.generated
            self.phase = "shrink"
            res.found[o.key] = d  # hypothesis shrinks: the last failing schedule of a class is its smallest
            if first and self.on_found is not None:
                self.on_found(o.key, d)
            raise failure_class(o.key)(o.summary)

    def run(self, db: ExampleDatabase | None) -> list[str]:
        """Run hypothesis; the failure classes found (each shrunk by hypothesis), in order."""
        spec = self.spec
        phases = [Phase.explicit, Phase.reuse, Phase.generate, Phase.target] + ([Phase.shrink] if spec.shrink else [])
        test = hypothesis_seed(spec.seed)(given(template_scenarios(self.template))(self.check))
        # settings go on last: hypothesis.seed() switches the example database off (it is meant
        # for replaying one run), and a settings decorator applied after it decides the database
        # again. We want both: a reproducible search that still starts from saved failures.
        prop = settings(max_examples=spec.budget, database=db, deadline=None, derandomize=False, phases=phases,
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


def run_shard(template: Template, spec: ShardSpec, *, stop: Callable[[], bool] | None = None,
              on_found: Found | None = None, on_example: Callable[[int, str], None] | None = None) -> ShardResult:
    """Search one shard. `stop` is polled between examples (a stopped shard returns what it
    found so far, `stopped` set); `on_found` hears of each failure class when first seen."""
    search = _Search(template, spec, stop, on_found, on_example)
    t0, c0 = time.perf_counter(), time.process_time()
    with contextlib.ExitStack() as stack:
        db = None
        if spec.use_db:
            source = None
            if spec.replay:  # the saved examples, as files in a folder of this shard's own
                tmp = stack.enter_context(tempfile.TemporaryDirectory(prefix="simdist-fuzz-db-"))
                for rel, data in spec.replay.items():
                    p = Path(tmp, rel)
                    p.parent.mkdir(parents=True, exist_ok=True)
                    p.write_bytes(data)
                source = DirectoryBasedExampleDatabase(tmp)
            db = RecordingDatabase(source)
        try:
            search.res.keys = search.run(db)
        except KeyboardInterrupt:  # ShardStopped, or Ctrl-C itself when the shard runs in the main process
            search.res.stopped = True
        if db is not None:
            search.res.db_ops = db.ops
    res = search.res
    if res.stopped:  # hypothesis did not finish: keep what was found, in the order found
        res.keys = list(res.found)
    ck = search.checker
    res.schedules, res.compressed, res.resimulated, res.reused = ck.simulated, ck.compressed, ck.resimulated, ck.reused
    res.iterations_full, res.iterations_run = ck.iterations_full, ck.iterations_run
    res.seconds, res.cpu_seconds, res.worker = time.perf_counter() - t0, time.process_time() - c0, os.getpid()
    return res
