"""The per-rank walk that every race of `simdist.races` is named by: which fields each rank
differs in, whether a real rank stopped short of the simulated one, when a rank failed on the
simulated clocks, and the loops that name one race per differing rank.

Why a module of its own: these are shared by every kind of race (exit, rendezvous,
connect, teardown, send-band; agent, `simdist.agent_race`; tie and reset,
`simdist.closure_races`) and say nothing about any one of them, while `simdist.races` keeps
the kinds themselves, their measurements (its docstring) and the front door (`named_races`).
Kept apart, `simdist.races` stays within the house limit on a module's size
(tests/test_layout.py) and the walk can be read without the races' long record. It imports
nothing of `simdist.races` (no cycle): the races import it.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Mapping
from typing import TypeVar

from simdist.compare import Comparison
from simdist.report import RankResult, Report, TraceEntry

PEER_GONE = re.compile(r"by peer \(rank (\d+) (?:has exited|timed out)\)")  # the simulator's wording
# what a partner of a rank that left early may show apart from the simulator: how it failed
CHAINED_FIELDS = frozenset({"status", "error", "output"})
# what a partner that waited for a racer outside any operation may show apart from the simulator
STOPPED_FIELDS = CHAINED_FIELDS | {"location", "trace", "blocked_in", "inputs_processed"}
# a racer of the group-connection race (`races.ConnectRace`, `init_race.InitRace`): Gloo's connectFullMesh
# failed with a peer's closure (measured: closed or reset; not a refusal, which no peer that connected its side makes)
CONNECT_CLOSED = re.compile(r"connectFullMesh failed with .*Connection (?:closed|reset) by peer")
GLOO_ERRORS = frozenset({"timeout", "peer_lost"})  # how a Gloo wait itself fails: its timeout or a peer's closure
_R = TypeVar("_R")


def each_rank(sim: Report, real: Report, cmp: Comparison,
              namers: tuple[Callable[[Report, Report, int], _R | None], ...]) -> list[_R]:
    """One race per differing rank, by the first of `namers` that names it, when every
    difference of `cmp` is a rank's error and each such rank is named; else empty."""
    if cmp.agree or any(d.field != "error" or d.rank is None for d in cmp.differences):
        return []
    races = [next((r for r in (namer(sim, real, d.rank) for namer in namers) if r is not None), None)
             for d in cmp.differences if d.rank is not None]
    return [r for r in races if r is not None] if all(r is not None for r in races) else []


def lost_peer(r: RankResult) -> int | None:
    """The peer whose process's end failed `r`, by the simulator's words (`PEER_GONE`); None:
    it lost no peer."""
    cause = PEER_GONE.search(r.error.message) if r.error is not None and r.error.category == "peer_lost" else None
    return None if cause is None else int(cause.group(1))


def failed_at(sims: Mapping[int, RankResult], rank: int, seen: frozenset[int] = frozenset()) -> float:
    """When `rank` failed on the simulated clocks: a rank that loses a peer fails when the peer
    exited or timed out, which its own clock (`RankResult.time`: its last issue) does not show."""
    r = sims[rank]
    peer = lost_peer(r)
    if peer is None or peer in seen:
        return r.time
    return max(r.time, failed_at(sims, peer, seen | {rank}))


def stopped_short(sim: RankResult, real: RankResult) -> bool:
    """The real rank did and printed a beginning of what the simulated one did and printed."""
    return ([e.key() for e in real.trace] == [e.key() for e in sim.trace[:len(real.trace)]]
            and real.output == sim.output[:len(real.output)] and real.inputs_processed <= sim.inputs_processed)


def failed_after_last(sim: RankResult, real: RankResult, differ: set[str],
                       category: str) -> tuple[TraceEntry, TraceEntry] | None:
    """A rank that on real Gloo failed (`category`) after its last operation, which the
    simulator completes, having done and printed only what the simulator has it do first, and
    differing in nothing else: (that real entry, the simulated one); else None. (A real
    entry's `completed` says nothing here: the recorder marks an operation that raised as
    completed.)"""
    if not differ <= STOPPED_FIELDS or real.error is None or real.error.category != category or not real.trace:
        return None
    mine = sim.trace[len(real.trace) - 1] if len(sim.trace) >= len(real.trace) else None
    if mine is None or not mine.completed or not stopped_short(sim, real):
        return None
    return real.trace[-1], mine


RankNamer = Callable[[dict[int, RankResult], dict[int, RankResult], int, set[str]], _R | None]


def every_differing_rank(sim: Report, real: Report, cmp: Comparison, namer: RankNamer[_R]) -> list[_R]:
    """One race per differing rank by `namer` (given both runs' ranks, the rank and the fields
    it differs in), when it names every one and no difference is of no rank, apart from the
    run's outcome turned to an error on real Gloo (a racer's); else empty."""
    if (fields := fields_by_rank(real, cmp)) is None:
        return []
    sims, reals = {r.rank: r for r in sim.ranks}, {r.rank: r for r in real.ranks}
    races = [namer(sims, reals, rank, differ) for rank, differ in sorted(fields.items())]
    return [r for r in races if r is not None] if races and all(r is not None for r in races) else []


def fields_by_rank(real: Report, cmp: Comparison) -> dict[int, set[str]] | None:
    """The fields each rank differs in, when every difference is a rank's or the run's outcome
    turned to an error on real Gloo (a racer's), and none is of the ranks' count; else None."""
    fields: dict[int, set[str]] = {}
    for d in cmp.differences:
        if d.field == "ranks" or d.rank is None and (d.field != "outcome" or real.outcome != "error"):
            return None
        if d.rank is not None:
            fields.setdefault(d.rank, set()).add(d.field)
    return fields
