"""The judge of one schedule: simulate it, check it, remember the answer.

`Checker.check` is the fuzz property's verdict for a concrete scenario dict; it is pure (the
same dict always gets the same `Outcome`), which is what lets a campaign's shards run
anywhere and lets the greedy shrinker ask again for free (the cache).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simdist.check.classify import check_run
from simdist.engine.core import CostLike
from simdist.errors import ScenarioError
from simdist.fuzz.compress import passes_compressed, verdict_key
from simdist.fuzz.compress import plan as compress_plan
from simdist.fuzz.counterexample import canonical
from simdist.fuzz.template import Template
from simdist.scenario import Scenario, parse_scenario
from simdist.sim import cycle_collector_paused, default_cost, simulate


@dataclass
class Outcome:
    """What one schedule did, as much as the fuzzer keeps (the report itself is not cached)."""

    failed: bool
    key: str  # failure class: "<kind>/<outcome>"; "ok" when it passed
    signature: str
    summary: str


class Checker:
    """Simulates and checks schedules, with a cache keyed by the concrete scenario.

    With `compress` (the default) a schedule is first judged on its compressed form
    (`simdist.fuzz.compress`: the steady middle of every gap between distinct input counts
    removed). A pass of a run whose ranks stayed in step is final; anything else (a failure,
    or ranks out of step) is re-simulated in full, so every failure class, signature and
    summary the fuzzer reports, shrinks on and writes is the full schedule's own.

    Compressed verdicts are kept by `compress.verdict_key` (what determines the compressed
    run's whole input): schedules that differ only in how long their steady gaps are share one
    compressed run, simulated once per checker. Only the compressed pass/unknown answer is
    shared; a failure is still judged on its own full schedule.
    """

    COST_OF_KEEP = 256  # topology objects whose cost model is found by identity (`cost`)

    def __init__(self, template: Template, compress: bool = True):
        self.template = template
        self.compress = compress
        self.cache: dict[str, Outcome] = {}
        self.simulated = 0
        self.compressed = 0  # schedules judged on a compressed run
        self.resimulated = 0  # of those, re-simulated in full (failed, or ranks out of step)
        self.iterations_full = 0  # sum over schedules of the full schedule's max input count
        self.iterations_run = 0  # ... and of the max input count actually simulated
        self.reused = 0  # compressed schedules whose compressed run was already judged (`verdicts`)
        self.verdicts: dict[tuple[str, tuple[int, ...], tuple[int, ...]], bool] = {}  # verdict_key -> passes_compressed
        self._costs: dict[tuple[str, int], CostLike] = {}
        # by the topology's identity; at most COST_OF_KEEP (each scenario the shrinker parses has a
        # topology object of its own: unbounded, this held one per schedule checked)
        self._cost_of: dict[tuple[int, int], tuple[Any, CostLike]] = {}

    def cost(self, s: Scenario) -> CostLike:
        """The scenario's cost model, made once per (topology, world size) and kept: the same
        model `simulate` would build (`simdist.sim.default_cost`), with its per-call caches warm."""
        seen = self._cost_of.get((id(s.topology), s.world_size))
        if seen is not None and seen[0] is s.topology:  # this very topology object (a template's scenarios share it)
            return seen[1]
        key = (s.topology.model_dump_json(), s.world_size)
        c = self._costs.get(key)
        if c is None:
            c = self._costs[key] = default_cost(s)
        if len(self._cost_of) >= self.COST_OF_KEEP:
            self._cost_of.clear()
        self._cost_of[(id(s.topology), s.world_size)] = (s.topology, c)  # holds the topology: its id stays its own
        return c

    def _judge(self, s: Scenario) -> Outcome:
        v = check_run(simulate(s, self.cost(s)), s, invariants=self.template.invariants)
        return Outcome(v.failed, f"{v.kind}/{v.outcome}" if v.failed else "ok", v.signature, v.summary)

    def check(self, d: dict[str, Any], s: Scenario | None = None, key: str | None = None) -> Outcome | None:
        """None when `d` is not a valid scenario. `key`: ``canonical(d)``, when the caller has it."""
        k = canonical(d) if key is None else key
        hit = self.cache.get(k)
        if hit is not None:
            return hit
        if s is None:
            try:
                s = parse_scenario(d, source=self.template.source)
            except ScenarioError:
                return None
        # The collector stays paused until the run's report is dropped: resumed inside
        # `simulate`, it would first walk the whole report (its trace entries are the young
        # objects still alive), a twentieth of a schedule's cost, for a report about to die.
        with cycle_collector_paused():
            out = self._outcome(d, s)
        self.simulated += 1
        self.cache[k] = out
        return out

    def _outcome(self, d: dict[str, Any], s: Scenario) -> Outcome:
        full = max(s.counts(), default=0)
        self.iterations_full += full
        p = compress_plan(s) if self.compress else None
        if p is not None and p.compressed:
            self.compressed += 1
            vk = verdict_key(d, p)
            passed = self.verdicts.get(vk)
            if passed is None:
                self.iterations_run += max(p.compressed_counts, default=0)
                passed = self.verdicts[vk] = passes_compressed(s, p, invariants=self.template.invariants,
                                                               cost=self.cost(s))
            else:
                self.reused += 1
            if passed:
                out = Outcome(False, "ok", "ok", "no failure")
            else:  # failed, or ranks out of step: judge the full schedule (exact class, signature, summary)
                self.resimulated += 1
                self.iterations_run += full
                out = self._judge(s)
        else:
            self.iterations_run += full
            out = self._judge(s)
        return out
