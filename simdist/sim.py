"""Run a scenario in the simulator and turn what happened into a `Report`."""

from __future__ import annotations

import gc
from collections.abc import Generator, Iterator
from contextlib import contextmanager
from typing import Any

import simpy

from simdist.engine.core import CostLike, Engine, RankRaised
from simdist.network.cost import CostModel
from simdist.program.budget import check_ops
from simdist.report import RankError, RankResult, Report, overall_outcome, phase_spans
from simdist.scenario import Scenario
from simdist.simrank import RankOutcome, SimRank
from simdist.vocab import WORLD


class AlphaBeta:
    """The simplest cost model (ring-like alpha-beta): a fixed, easy-to-check clock for tests."""

    def __init__(self, alpha: float = 50e-6, beta: float = 1 / 1e9):
        self.alpha = alpha
        self.beta = beta

    def collective_time(self, op: str, nbytes: int, ranks: list[int], algo: str | None = None) -> float:
        p = max(len(ranks), 1)
        if p == 1:
            return 0.0
        factor = 2 * (p - 1) / p if op == "all_reduce" else (p - 1) / p
        return 2 * (p - 1) * self.alpha + factor * nbytes * self.beta

    def p2p_time(self, nbytes: int, src: int, dst: int) -> float:
        return self.alpha + nbytes * self.beta


def default_cost(scenario: Scenario) -> CostLike:
    """The scenario topology's cost model (docs/cost-model.md)."""
    return CostModel.from_scenario_topology(scenario.topology, scenario.world_size)


@contextmanager
def cycle_collector_paused() -> Iterator[None]:
    """Python's cycle collector off for the duration (as it was before, after).

    A run allocates a few objects per rank and collective that live until every member
    has issued it (p calls, events and works for a collective of p ranks): at 1,024 ranks
    they outlive the young generations, and each time enough of them die old the
    collector walks every object alive, the whole trace so far included. That made the
    cost per collective grow with the ranks (half the time of a 1,024-rank run). The
    engine builds no reference cycles (tests/test_engine_scale.py checks that what only
    the collector could free stays a handful of objects however long the run), so
    reference counting frees everything as it goes and pausing the collector loses nothing."""
    was = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was:
            gc.enable()


def simulate(scenario: Scenario, cost: CostLike | None = None) -> Report:
    """Simulate every rank's program until all finish or nothing more can happen.

    A scenario that may need more operations than `limits.OPS` allows raises LimitError
    before anything runs (`simdist.program.budget`)."""
    check_ops(scenario)
    with cycle_collector_paused():
        return _simulate(scenario, cost)


def _simulate(scenario: Scenario, cost: CostLike | None) -> Report:
    groups = {WORLD: list(range(scenario.world_size))}
    # sorted: the real side makes them with new_group's default (sort_ranks=True)
    groups.update({g.name: sorted(g.ranks) for g in scenario.groups})
    engine = Engine(scenario.world_size, groups, cost or default_cost(scenario), scenario.backend)
    programs = [SimRank(scenario, engine, r) for r in range(scenario.world_size)]
    status: dict[int, str] = {}
    errors: dict[int, RankError] = {}
    end_time: dict[int, float] = {}

    def proc(r: int) -> Generator[Any, Any, None]:
        try:
            yield from programs[r].run()
            status[r] = "completed"
        except RankRaised as e:
            status[r] = "error"
            errors[r] = e.error
        except simpy.Interrupt:
            status[r] = "aborted"
        end_time[r] = engine.env.now
        if status[r] != "completed" or scenario.on_finish == "exit":
            engine.rank_gone(r)

    for r in range(scenario.world_size):
        engine.ranks[r].process = engine.env.process(proc(r))
    engine.env.run()
    while engine.settle_absent():  # nothing can happen any more: finish what Gloo would
        engine.env.run()

    results: list[RankResult] = []
    for p in programs:
        p.collect_observed()
    for r in range(scenario.world_size):
        out: RankOutcome = programs[r].out
        rs = engine.ranks[r]
        st = status.get(r, "hang")
        err = errors.get(r)
        if st == "aborted":
            err = rs.abort_error
        blocked = waiting = None
        if st == "hang":
            waiting = rs.waiting_on
            pending = [e for e in rs.trace if not e.completed and e.t_done is None]
            blocked = pending[0] if pending else waiting
        results.append(
            RankResult(
                rank=r,
                status=st,  # type: ignore[arg-type]
                inputs_processed=out.inputs_processed,
                error=err,
                observed=out.observed,
                trace=rs.trace,
                time=end_time.get(r, engine.env.now),
                blocked_in=blocked,
                waiting_in=waiting,
                warnings=out.warnings,
                compute=out.compute,
                phases=phase_spans(out.phases, end_time.get(r, engine.env.now)),
            )
        )
    return Report(
        scenario=scenario.name,
        source="sim",
        outcome=overall_outcome([r.status for r in results]),
        ranks=results,
        findings=engine.findings,
        backend=scenario.backend,
        world_size=scenario.world_size,
    )
