"""Fuzzing a user's own script: how many batches each rank gets, and how many ranks there are.

`simdist fuzz train.py` asks the classic question "what if rank 3 gets fewer batches?" of an
unmodified script. A *schedule* is a world size and one DataLoader cap per rank
(`--batches`, `simdist.script.rank.batches`); hypothesis draws schedules, the simulator runs
each (through a fork server, `simdist.script.zygote`: ~0.3 s for a small DDP schedule), and
the checker judges the report as it judges a scenario's (`simdist.check.classify.judge`):
a run fails when it does not complete or a finding was made (hang, mismatch, a rank that
raised, a peer that exited).

* **World sizes**: torchrun-style scripts (`worlds=(lo, hi)`) are started with each world
  size drawn; a script that starts its own ranks (`mp.spawn`) has the world size it chooses,
  and only the caps are explored.
* **Caps** are drawn from `batches=(lo, hi)`. A *baseline* run comes first: the smallest
  world with every rank capped at `hi`. If it fails, the script fails without any uneven
  input, and that is the one thing reported (not one failure per schedule). It also shows
  how long an epoch is: caps above an uncapped epoch's length change nothing, so `hi` comes
  down to it; a script that iterates no DataLoader has no caps to explore.
* **Shrinking**: each failure class (root-cause kind and outcome) is shrunk by hypothesis,
  then greedily to the smallest failing schedule (`Schedule.size`: fewest ranks, then the
  smallest difference between caps, then the fewest batches), and written down as commands
  and a replay file (`simdist.fuzz.script_replay`).

Identical schedules run once (cached); hypothesis is used through its public API only.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from hypothesis import HealthCheck, Phase, Verbosity, given, settings
from hypothesis import seed as hypothesis_seed
from hypothesis import strategies as st

from simdist.check.classify import judge
from simdist.errors import ScriptError
from simdist.fuzz.script_replay import Schedule, command, write_replay
from simdist.fuzz.search import FuzzFailure, failure_class
from simdist.limits import LOCAL_RANKS
from simdist.script.api import BACKENDS, default_gpus, execute
from simdist.script.env import SIM
from simdist.script.zygote import Zygote

GREEDY_LIMIT = 60  # runs the greedy pass may spend per failure class


@dataclass(frozen=True)
class Space:
    """What to explore for one script."""

    script: str
    args: tuple[str, ...] = ()
    worlds: tuple[int, int] | None = None  # torchrun-style world sizes; None: the script starts its own ranks
    batches: tuple[int, int] = (1, 8)  # caps drawn from lo..hi (hi may come down to an epoch's length)
    backend: str | None = None
    timeout_s: float = 60.0

    @property
    def torchrun(self) -> bool:
        return self.worlds is not None


def checked_space(script: str | Path, args: tuple[str, ...], worlds: tuple[int, int] | None,
                  batches: tuple[int, int], backend: str | None, timeout_s: float,
                  names: tuple[str, str, str] = ("nproc_per_node_range", "batches_range", "backend")) -> Space:
    """A `Space` whose ranges and backend are checked, for every front door (the CLI, the
    pytest fixture) in one place: bad input raises ScriptError naming the field as that door
    spells it (`names`: the world-size range, the caps range, the backend)."""
    for name, rng, low in ((names[0], worlds, 1), (names[1], batches, 0)):
        if rng is not None and (len(rng) != 2 or not low <= rng[0] <= rng[1]):
            raise ScriptError(f"{name}: expected (LO, HI) with {low} <= LO <= HI, got {rng!r}")
    if worlds is not None:
        LOCAL_RANKS.check(worlds[1], names[0], f"{worlds[1]:,} rank processes")
    if backend is not None and backend not in BACKENDS:
        raise ScriptError(f"{names[2]}: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    return Space(str(script), tuple(args), tuple(worlds) if worlds else None, tuple(batches), backend,  # type: ignore[arg-type]
                 timeout_s)


@dataclass
class Judged:
    """One schedule's verdict, as much as the fuzzer keeps."""

    failed: bool
    key: str  # failure class "<kind>/<outcome>"; "ok"
    signature: str
    summary: str
    notes: list[str]
    inputs: list[int]  # batches each rank's DataLoaders yielded


@dataclass
class ScriptCounterexample:
    key: str
    signature: str
    summary: str
    world_size: int
    caps: list[int]
    found_at: int  # schedule number at which this class was first seen
    explanation: list[str]
    replay: str  # simdist run ...
    replay_real: str  # simdist compare ... (the simulator beside real Gloo)
    path: str | None = None


@dataclass
class ScriptFuzzResult:
    script: str
    args: list[str]
    seed: int
    budget: int
    worlds: list[int] | None
    batches: list[int] | None  # the caps' range explored (None: no DataLoader, nothing to cap)
    examples: int = 0  # property evaluations (generation and shrinking), cache hits included
    schedules: int = 0  # distinct schedules run
    seconds: float = 0.0
    start_seconds: float = 0.0  # of `seconds`: starting the fork server (importing torch, once a search)
    failures: dict[str, int] = field(default_factory=dict)  # signature -> failing schedules
    counterexamples: list[ScriptCounterexample] = field(default_factory=list)
    baseline: dict[str, Any] = field(default_factory=dict)  # the first run: schedule, verdict
    baseline_failed: bool = False  # the script fails without uneven inputs: nothing else was tried
    notes: list[str] = field(default_factory=list)

    @property
    def failed(self) -> bool:
        return self.baseline_failed or bool(self.counterexamples)

    @property
    def rate(self) -> float:
        return self.schedules / self.seconds if self.seconds > 0 else 0.0

    @property
    def search_rate(self) -> float:
        """Schedules per second once the fork server had started (what a longer search gets)."""
        t = self.seconds - self.start_seconds
        return self.schedules / t if t > 0 else 0.0

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        d.update(failed=self.failed, schedules_per_second=round(self.rate, 2),
                 schedules_per_second_after_start=round(self.search_rate, 2), distinct_failures=len(self.failures))
        return d

    def lines(self, interrupted: bool = False) -> list[str]:
        """What `simdist fuzz SCRIPT.py` prints, one line each (the pytest fixture's failure
        message too): the search, then the baseline's failure or each counterexample with its
        explanation and the commands that replay it. The first word is the verdict."""
        worlds = f"world sizes {self.worlds[0]}-{self.worlds[1]}" if self.worlds else "its own world size"
        caps = f"batches {self.batches[0]}-{self.batches[1]} per rank" if self.batches else "no DataLoader caps"
        verdict = "interrupted" if interrupted else "FAIL" if self.failed else "ok"
        out = [f"{verdict} {self.script}: {self.schedules} schedules in {self.seconds:.1f} s ({self.start_seconds:.1f} s "
               f"starting the fork server, then {self.search_rate:.1f}/s; {worlds}, {caps}; seed {self.seed})"]
        out += [f"  note: {note}" for note in self.notes]
        if self.baseline_failed:
            b = self.baseline
            out.append(f"  the script fails without uneven inputs ({b['summary']}); nothing else was tried")
            out += [f"    {line}" for line in b["explanation"]]
            out.append(f"    replay: {b['replay']}")
        for c in self.counterexamples:
            caps_text = f", batches per rank {','.join(map(str, c.caps))}" if c.caps else ""
            out.append(f"  {c.key}: {c.world_size} ranks{caps_text} (first seen at schedule {c.found_at})")
            out += [f"    {line}" for line in c.explanation]  # all: the last line is often the hint that says how to fix it
            out.append(f"    replay in the simulator: {c.replay}")
            out.append(f"    beside real Gloo:        {c.replay_real}")
            if c.path:
                out.append(f"    written: {c.path}  (sh {c.path} [compare|real])")
        return out


PHASES = {"baseline": "baseline run", "generate": "searching", "shrink": "searching, shrinking",
          "post-shrink": "minimising"}  # what a progress display calls the search's phases


@dataclass(frozen=True)
class Tick:
    """Where the search stands, at each schedule it is about to check (for a progress display)."""

    examples: int  # schedules checked so far, this one included (cache hits too): what --budget counts while searching
    schedules: int  # distinct schedules run so far
    phase: str  # a key of PHASES
    found: tuple[str, ...]  # failure classes found so far

    def describe(self) -> str:
        found = f"; found {', '.join(self.found)}" if self.found else ""
        runs = f"{self.schedules} schedule{'' if self.schedules == 1 else 's'} run"
        return f"{PHASES.get(self.phase, self.phase)}: {runs}{found}"


class ScriptFuzzInterrupted(KeyboardInterrupt):
    """Ctrl-C during a search; `result` holds what was found, already written down."""

    def __init__(self, result: ScriptFuzzResult):
        super().__init__("interrupted")
        self.result = result


class ScriptFuzzer:
    """Runs, caches and judges schedules of one script; the search and the shrinking."""

    def __init__(self, space: Space, zygote: Zygote | None, result: ScriptFuzzResult,
                 on_example: Callable[[Tick], None] | None = None, out_dir: str | Path | None = None):
        self.space, self.zygote, self.res, self.on_example = space, zygote, result, on_example
        self.out_dir = out_dir
        self.cache: dict[Schedule, Judged] = {}
        self.phase = "baseline"
        self.best: dict[str, Schedule] = {}  # failure class -> smallest failing schedule seen
        self.first_seen: dict[str, int] = {}
        self.written: dict[str, Path] = {}  # failure class -> its replay file
        self.caps_range: tuple[int, int] | None = space.batches
        self.world_size = space.worlds[0] if space.worlds else 0

    # ------------------------------------------------------------------ one schedule
    def run(self, s: Schedule) -> Judged:
        hit = self.cache.get(s)
        if hit is not None:
            return hit
        out = self._execute(s)
        self.cache[s] = out
        self.res.schedules = len(self.cache)
        if out.failed:
            self.res.failures[out.signature] = self.res.failures.get(out.signature, 0) + 1
            self.first_seen.setdefault(out.key, self.res.schedules)
        return out

    def _execute(self, s: Schedule) -> Judged:
        sp = self.space
        try:
            sr = execute(sp.script, sp.args, nproc_per_node=s.world_size if sp.torchrun else None,
                         backend=sp.backend, timeout_s=sp.timeout_s, batches=list(s.caps) or None,
                         stdout=subprocess.DEVNULL, zygote=self.zygote, measure_compute=False)
        except ScriptError as e:
            if self.phase == "baseline":
                raise
            out = Judged(True, "script_error/error", "script_error", str(e), [str(e)], [])
        else:
            rep = sr.report
            v = judge(rep, list(rep.findings))
            out = Judged(v.failed, f"{v.kind}/{v.outcome}" if v.failed else "ok", v.signature, v.summary,
                         list(rep.notes), [r.inputs_processed for r in rep.ranks])
            if self.phase == "baseline":
                self._learn(sr)
        return out

    def _learn(self, sr: Any) -> None:
        """From the baseline run: the world size (as-is scripts) and which caps mean something."""
        self.world_size = sr.report.world_size
        if not any(r.inputs_processed for r in sr.report.ranks):
            self.caps_range = None
            self.res.notes.append("the script iterated no DataLoader: --batches caps change nothing; "
                                  + ("only the world size is explored" if self.space.torchrun else
                                     "nothing to explore (its world size is its own)"))
        elif not any(sr.capped) and self.caps_range is not None:
            longest = max(sr.longest_epoch)
            lo, hi = self.caps_range
            if longest < hi:
                self.caps_range = (min(lo, longest), longest)
                self.res.notes.append(f"an uncapped epoch yields at most {longest} batches: caps explored up to "
                                      f"{longest}")

    def _tick(self) -> None:
        self.res.examples += 1
        if self.on_example is not None:
            self.on_example(Tick(self.res.examples, self.res.schedules, self.phase, tuple(self.best)))

    # ------------------------------------------------------------------ baseline and search
    def baseline(self) -> bool:
        """Run the smallest world with every rank capped at the top of the range; True when
        it passed (the search may go on)."""
        self._tick()
        top = self.space.batches[1]
        j = self._execute(Schedule(self.world_size, (top,)))  # one cap for every rank: as-is scripts too
        s = Schedule(self.world_size, (top,) * self.world_size if self.caps_range else ())
        self.cache[s] = j
        self.res.schedules = len(self.cache)
        sp = self.space
        self.res.baseline = {"world_size": s.world_size, "caps": list(s.caps), "failed": j.failed,
                             "key": j.key, "summary": j.summary, "explanation": j.notes,
                             "replay": command("run", sp.script, sp.args, s, sp.torchrun, sp.backend)}
        self.res.baseline_failed = j.failed
        self.res.batches = list(self.caps_range) if self.caps_range else None
        return not j.failed

    def schedules(self) -> st.SearchStrategy[Schedule]:
        worlds = self.space.worlds or (self.world_size, self.world_size)
        caps = self.caps_range

        @st.composite
        def draw(d: Any) -> Schedule:
            w = d(st.integers(*worlds))
            if caps is None:
                return Schedule(w, ())
            return Schedule(w, tuple(d(st.lists(st.integers(*caps), min_size=w, max_size=w))))

        return draw()

    def check(self, s: Schedule) -> None:
        """The property: raises the failure's own class when the schedule fails."""
        self._tick()
        j = self.run(s)
        if j.failed:
            new = j.key not in self.best
            if new or s.size() < self.best[j.key].size():
                self.best[j.key] = s
            if new:  # written at once: a search cut short still leaves it behind
                _write(self, j.key, s, self.out_dir, "unshrunk")
            self.phase = "shrink"
            raise failure_class(j.key)(j.summary)

    def search(self, budget: int, seed: int, shrink: bool) -> list[str]:
        """Run hypothesis; the failure classes found, in order."""
        self.phase = "generate"
        phases = [Phase.explicit, Phase.generate] + ([Phase.shrink] if shrink else [])
        prop = settings(max_examples=budget, database=None, deadline=None, phases=phases,
                        suppress_health_check=list(HealthCheck), report_multiple_bugs=True,
                        verbosity=Verbosity.quiet, print_blob=False)(given(self.schedules())(self.check))
        raised: list[BaseException] = []
        try:
            hypothesis_seed(seed)(prop)()
        except FuzzFailure as e:
            raised = [e]
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

    # ------------------------------------------------------------------ greedy shrink
    def _candidates(self, s: Schedule) -> list[Schedule]:
        out: list[Schedule] = []
        w, caps = s.world_size, list(s.caps)
        if self.space.worlds is not None and w > self.space.worlds[0]:
            out += [Schedule(w - 1, tuple(caps[:i] + caps[i + 1:]) if caps else ()) for i in range(w)]
        if caps and self.caps_range is not None:
            lo, hi = self.caps_range
            for i, c in enumerate(caps):
                for v in sorted({lo, c - 1, c + 1}):
                    if lo <= v <= hi and v != c:
                        out.append(Schedule(w, tuple(caps[:i] + [v] + caps[i + 1:])))
        return sorted((c for c in out if c.size() < s.size()), key=Schedule.size)

    def greedy(self, s: Schedule, key: str, limit: int = GREEDY_LIMIT) -> Schedule:
        """Move to a smaller schedule of the same failure class while there is one."""
        spent, improved = 0, True
        while improved and spent < limit:
            improved = False
            for cand in self._candidates(s):
                spent += cand not in self.cache
                self._tick()
                if self.run(cand).key == key:
                    s, improved = cand, True
                    break
                if spent >= limit:
                    break
        return s


# ---------------------------------------------------------------------------- the whole search
def fuzz_script(space: Space, *, budget: int = 200, seed: int = 0, out_dir: str | Path | None = "failures",
                shrink: bool = True, on_example: Callable[[Tick], None] | None = None,
                fork_server: bool = True, zygote: Zygote | None = None) -> ScriptFuzzResult:
    """Explore `space`; returns what was tried and the counterexamples, each written under
    `out_dir` (None: not written) as soon as it is found and again once shrunk. Ctrl-C
    raises `ScriptFuzzInterrupted` after writing the smallest failing schedules so far.
    `zygote`: a sim-mode fork server that outlives the search (a test session's, made for
    any script), used instead of one made, and closed, here for this script."""
    res = ScriptFuzzResult(script=space.script, args=list(space.args), seed=seed, budget=budget,
                           worlds=list(space.worlds) if space.worlds else None, batches=list(space.batches))
    t0 = time.perf_counter()
    gpus = default_gpus(space.worlds[1] if space.worlds else None)
    own = zygote is None and fork_server
    if zygote is not None and zygote.gpus != gpus:
        raise ScriptError(f"zygote: it simulates {zygote.gpus} GPUs, the search needs {gpus}")
    if own:
        zygote = Zygote(space.script, mode=SIM, gpus=gpus, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    if own and zygote is not None:  # a schedule's ranks start without waiting for their forks
        zygote.keep_spares(space.worlds[1] if space.worlds else 1)
    res.start_seconds = time.perf_counter() - t0
    fz = ScriptFuzzer(space, zygote, res, on_example, out_dir)
    try:
        if fz.baseline() and (fz.caps_range is not None or space.worlds is not None):
            keys = fz.search(budget, seed, shrink)
            fz.phase = "post-shrink"
            for key in keys:
                best = fz.greedy(fz.best[key], key) if shrink else fz.best[key]
                res.counterexamples.append(_write(fz, key, best, out_dir, "shrunk" if shrink else "unshrunk"))
    except KeyboardInterrupt:
        res.counterexamples = [_write(fz, k, s, out_dir, "interrupted") for k, s in fz.best.items()]
        res.seconds = time.perf_counter() - t0
        raise ScriptFuzzInterrupted(res) from None
    finally:
        if own and zygote is not None:
            zygote.close()
    res.seconds = time.perf_counter() - t0
    return res


def _write(fz: ScriptFuzzer, key: str, s: Schedule, out_dir: str | Path | None, state: str) -> ScriptCounterexample:
    """The counterexample of failure class `key` at schedule `s`, written down (replacing the
    class's earlier file)."""
    sp, j = fz.space, fz.run(s)
    c = ScriptCounterexample(key=key, signature=j.signature, summary=j.summary, world_size=s.world_size,
                             caps=list(s.caps), found_at=fz.first_seen.get(key, 0), explanation=j.notes,
                             replay=command("run", sp.script, sp.args, s, sp.torchrun, sp.backend),
                             replay_real=command("compare", sp.script, sp.args, s, sp.torchrun))
    if out_dir is not None:
        old = fz.written.pop(key, None)
        path = write_replay(Path(out_dir), sp.script, sp.args, s, sp.torchrun, sp.backend, seed=fz.res.seed,
                            key=key, summary=j.summary, explanation=j.notes, state=state)
        if old is not None and old != path:
            old.unlink(missing_ok=True)
        fz.written[key] = path
        c.path = str(path)
    return c
