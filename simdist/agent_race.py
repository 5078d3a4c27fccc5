"""The race of torchrun's agent (`AgentRace`, `agent_races`), a sixth kind beside those of
`simdist.races`.

Torchrun-style, once a worker fails the agent SIGTERMs the others (`simdist.script.agent`).
The simulator acts one monitor interval (0.1 s) after the failure on the simulated clock; real
torchrun's SIGTERM comes once the failed process has torn down and the next poll saw it
(docs/script-backend.md, "torchrun's agent"). A rank whose next step (its own end, an
operation, a sleep) came within `AGENT_WINDOW_S` after the simulated agent's instant (the
simulated report's note says so) is ended by SIGTERM in the simulator and may end its own way
on real Gloo, having done no more than the simulator's rank plus that end.

A module of its own so that `simdist.races` stays within the house size rule; it imports only
the shared walk (`simdist.race_walk`), and `simdist.races` imports it (no cycle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from simdist.compare import Comparison
from simdist.race_walk import STOPPED_FIELDS, every_differing_rank, stopped_short
from simdist.report import RankResult, Report
from simdist.vocab import AGENT_TERMINATED


@dataclass(frozen=True)
class AgentRace:
    """The simulator's torchrun agent ended rank `rank` by SIGTERM; its next step came `gap_s`
    after that instant on the simulated clock, within `AGENT_WINDOW_S`; on real Gloo it got
    there before the agent's SIGTERM (the failed process's teardown comes first)."""

    kind: ClassVar[str] = "agent"
    rank: int
    gap_s: float

    def describe(self) -> str:
        return (f"rank {self.rank}: agent race, not a model difference: the simulator's torchrun agent ends it "
                f"{self.gap_s:.2f} s before its next step; on real torchrun the SIGTERM waits for the failed "
                f"process's teardown, and the rank ended its own way first")


_AGENT_NOTE = re.compile(r"^rank (\d+): its next step came ([\d.]+) s after torchrun's agent's SIGTERM")


def agent_races(sim: Report, real: Report, cmp: Comparison) -> list[AgentRace]:
    """The agent races that make up every difference of `cmp` (the module's docstring): each
    differing rank was ended by the simulator's agent within the window before its next step
    (the simulated report's note), and on real Gloo ended its own way, having done what the
    simulator's rank did first. Empty when the runs agree or anything else differs."""
    gaps = {int(m.group(1)): float(m.group(2)) for m in map(_AGENT_NOTE.match, sim.notes) if m}

    def namer(sims: dict[int, RankResult], reals: dict[int, RankResult], rank: int,
              differ: set[str]) -> AgentRace | None:
        s, r = sims[rank], reals.get(rank)
        if rank not in gaps or r is None or not differ <= STOPPED_FIELDS or r.status == "hang":
            return None
        if r.exit is not None and r.exit.startswith(AGENT_TERMINATED):
            return None
        return AgentRace(rank, gaps[rank]) if stopped_short(r, s) else None

    return every_differing_rank(sim, real, cmp, namer)
