"""The race of torchrun's agent (`AgentRace`, `agent_races`), a sixth kind beside those of
`simdist.races`.

Torchrun-style, once a worker fails the agent SIGTERMs the others (`simdist.script.agent`).
Real torchrun's SIGTERM comes once the failed process has torn down and the next poll saw it:
anywhere in a measured band after the failure (`agent.sigterm_band`: 0.06-4 s after a
process that tore its interpreter down, within a poll after one that did not, `os._exit` or a
signal; docs/script-backend.md, "torchrun's agent"), by host and load. The simulator acts at one
instant inside it (`agent.agent_instant`), so a rank whose next step (its own end, an
operation, a sleep) fell inside the band may have gone the other way on real torchrun; the
simulated report's note says so (`agent_race_note`), both ways:

* "next step": the simulator's agent ended the rank before that step; on real Gloo the
  SIGTERM came later and the rank got further (its own end, more operations and lines).
* "own end": the simulator's rank ended its own way before its agent came; on real Gloo
  the SIGTERM came first and ended it short of that.

A rank whose step fell outside the band is no race: the agent's verdict there is firm. For a
rank whose script returned, the step is its process's exit (`agent.exit_band`: real Gloo's
destroy_process_group, then the exit), a race wherever that band meets the SIGTERM's.

A module of its own so that `simdist.races` stays within the house size rule; it imports only
the shared walk (`simdist.race_walk`), and `simdist.races` imports it (no cycle).
"""

from __future__ import annotations

import re
from dataclasses import dataclass
from typing import ClassVar

from simdist.closure_races import TIE_RACE_S
from simdist.compare import Comparison
from simdist.race_walk import STOPPED_FIELDS, every_differing_rank, stopped_short
from simdist.report import RankResult, Report
from simdist.vocab import AGENT_TERMINATED

_NEXT, _OWN = "next step", "own end"
_NOTE = re.compile(r"^rank (\d+): agent race: its (next step|own end) came ([\d.]+) s after rank (\d+)'s failure")


def agent_race_note(rank: int, step: str, gap_s: float, failed: int, via: int | None = None,
                    lost: int | None = None, tied: bool = False) -> str:
    """The simulated report's note for a rank whose `step` ("next step": past the simulated
    agent's instant, "own end": before it) came `gap_s` after rank `failed`'s failure, inside
    the band of real torchrun's SIGTERM; or, `via`, a step that is the loss of rank `via`,
    which failed too: on real Gloo it comes once that process tore down, which races the
    SIGTERM whatever `gap_s`; or, `lost`, a step that is the loss of rank `lost`'s end: on real
    Gloo it comes once the rank's own threads see the closure and raise, which under load can
    outlast the rest of the agent's poll after the first failed process's end (docs/script-backend.md,
    "torchrun's agent", a loss at the failure's instant); or, `tied`, a step that is the rank's own
    Gloo timeout, tied with rank `failed`'s (`tied_timeout`)."""
    how = ("ended here by the agent; on real torchrun the SIGTERM may come later and the rank get there"
           if step == _NEXT else "the simulator's agent came later; on real torchrun the SIGTERM may come first")
    why = (f", its own Gloo timeout tied with rank {failed}'s, which on real Gloo fires later by as much as the load "
           f"stretches each rank's way into its wait" if tied else
           f", and on real Gloo only once rank {via}, which failed too, had torn down" if via is not None else
           f", the loss of rank {lost}'s end, on real Gloo once its own threads see the closure and raise"
           if lost is not None else "")
    return (f"rank {rank}: agent race: its {step} came {gap_s:.2f} s after rank {failed}'s failure on the "
            f"simulated clock{why}, inside the band of torchrun's SIGTERM (the failed process's end, after "
            f"its teardown if any, then a poll): {how}")


def tied_timeout(first: RankResult, r: RankResult, gap_s: float) -> bool:
    """Whether rank `r`'s failure, `gap_s` after the first failure (`first`'s), is its own Gloo
    timeout tied with `first`'s (within `TIE_RACE_S`): on real Gloo each deadline is counted from
    the rank's own entry into its wait, apart on the host by what each rank did before it, which
    the load stretches, so the torchrun-style SIGTERM after `first`'s failure can come before
    `r`'s own timeout fires (tests/scripts/pg_timeouts.py --case never: rank 1 SIGTERMed in
    docs/script-backend.md, "Races of the real run"). Both ways: a race."""
    return (0.0 <= gap_s <= TIE_RACE_S and r.error is not None and r.error.category == "timeout"
            and first.error is not None and first.error.category == "timeout")


@dataclass(frozen=True)
class AgentRace:
    """Rank `rank`'s step came `gap_s` after rank `failed`'s failure, inside the band of
    torchrun's SIGTERM; `sim_ended`: the simulator's agent ended it before the step and real
    Gloo's rank got further, else the other way round."""

    kind: ClassVar[str] = "agent"
    rank: int
    failed: int
    gap_s: float
    sim_ended: bool

    def describe(self) -> str:
        first, then = ("the simulator's", "real torchrun's") if self.sim_ended else ("real torchrun's", "the simulator's")
        return (f"rank {self.rank}: agent race, not a model difference: its next step came {self.gap_s:.2f} s "
                f"after rank {self.failed} failed, inside the band of torchrun's SIGTERM (the failed process's "
                f"end, after its teardown if any, then a poll); {first} agent ended it before the step, {then} came after it")


def noted_agent_races(sim: Report) -> dict[int, tuple[bool, float, int]]:
    """The ranks the simulated report's notes put in an agent race (`agent_race_note`): rank ->
    (whether the simulator's agent ended it before its step, the step's gap after the failure,
    the failed rank)."""
    return {int(m.group(1)): (m.group(2) == _NEXT, float(m.group(3)), int(m.group(4)))
            for m in map(_NOTE.match, sim.notes) if m}


def agent_races(sim: Report, real: Report, cmp: Comparison) -> list[AgentRace]:
    """The agent races that make up every difference of `cmp` (the module's docstring): each
    differing rank has the simulated report's note, and on the side the agent ended first
    it did and printed a beginning of what it did on the other. Empty when the runs agree or
    anything else differs."""
    noted = noted_agent_races(sim)

    def namer(sims: dict[int, RankResult], reals: dict[int, RankResult], rank: int,
              differ: set[str]) -> AgentRace | None:
        s, r = sims[rank], reals.get(rank)
        if rank not in noted or r is None or not differ <= STOPPED_FIELDS or "hang" in (r.status, s.status):
            return None
        sim_ended, gap, failed = noted[rank]
        ended, other = (s, r) if sim_ended else (r, s)
        if other.exit is not None and other.exit.startswith(AGENT_TERMINATED):
            return None  # the agent ended both sides: the difference is not the agent's timing
        if ended.exit is None or not ended.exit.startswith(AGENT_TERMINATED) or not stopped_short(other, ended):
            return None
        return AgentRace(rank, failed, gap, sim_ended)

    return every_differing_rank(sim, real, cmp, namer)
