"""The group-connection race as it shows in `init_process_group` (`simdist.races.ConnectRace`
names it in `compare`): the simulated report's note on the ranks where it may happen
(`init_race_notes`), so that a test accepts it there only (`noted_init_races`).

Gloo's init connects the world's pairs (connectFullMesh) and each rank returns once ITS side of
each pair is connected, not its peers'. A rank that leaves right after init, having completed
no operation (it returns, raises, or exits: tests/scripts/nccl_init.py's rank 0, refused NCCL
in `new_group`; pg_timeouts.py --case monitored_sub's rank 0, with nothing to do), closes its
sockets while a peer that the host descheduled may still be connecting its side of their pair:
that peer fails in init ("Gloo connectFullMesh failed with ... Connection closed by peer")
where the simulator, which connects a group at once, has it return. Measured with
`tests/scripts/leaves_after_init.py` (`python bench/race_tally.py tests/scripts/
leaves_after_init.py --nproc 3 --n 30` beside 4 CPU burners, load 10-13): 2 of 30 and 3 of 30
real runs (docs/script-backend.md, "Races of the real run").

So the simulated report notes, in a run of one generation of the world (a re-init's is not
measured), each rank that had completed no operation by the time a peer that had completed
none either ended on its own within `INIT_RACE_S` of the start on the simulated clocks (a rank
that completed an operation had left init: its side was connected). A peer that ended later is
no race of this window (`INIT_RACE_S`, the margin of `simdist.races.EXIT_RACE_S`).

A real run is that race (`InitRace`, `init_races`) when every differing rank is noted, did and
printed a beginning of what the simulator has it do, and ended on real Gloo in one of the ways
the race makes: failed connecting init's full mesh with a peer's closure (the racer, one at
least), lost a peer (a racer's end), or was ended by torchrun's agent once a racer failed (in
`tests/scripts/leaves_after_init.py`, rank 2 SIGTERMed still in init). `ConnectRace` names
the same in `compare` with no note (and for `new_group` too); this one asks for the note.

A module of its own, as `simdist.agent_race`: it imports only the shared walk
(`simdist.race_walk`); `simdist.races` and the report's notes (`simdist.script.race_notes`)
import it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import ClassVar

from simdist.compare import Comparison
from simdist.race_walk import CONNECT_CLOSED, STOPPED_FIELDS, every_differing_rank, stopped_short
from simdist.report import RankResult, Report
from simdist.vocab import AGENT_TERMINATED

INIT_RACE_S = 1.5  # a peer descheduled this long inside init: the worst teardown measured (`races.EXIT_RACE_S`)
_NOTE = re.compile(r"^rank (\d+): init connect race: rank (\d+) ended ([\d.]+) s")


def init_race_note(rank: int, left: int, at_s: float) -> str:
    """The simulated report's note for rank `rank`, which may still be connecting its pair with
    rank `left` in init on real Gloo when `left`'s process ends (`at_s`, simulated clock)."""
    return (f"rank {rank}: init connect race: rank {left} ended {at_s:.2f} s into the run on the simulated clocks, "
            f"having completed no operation, before this rank completed any; Gloo's init_process_group returns once "
            f"a rank's own side of each pair is connected, so on real Gloo this rank may still be connecting its pair "
            f"with rank {left} then and fail in init_process_group (\"Gloo connectFullMesh failed with ... Connection "
            f"closed by peer\"); the simulator connects the world at once")


def _left_early(r: RankResult) -> float | None:
    """When rank `r` ended on its own having completed no operation (its clock at its end), if
    within `INIT_RACE_S`; None otherwise (it completed one, it hangs, the agent or a signal ended
    it, it lost a peer: that peer's end came first, or it ended later)."""
    own = r.status in ("completed", "error") and r.exit is not None and not r.exit.startswith(AGENT_TERMINATED) \
        and (r.error is None or r.error.category not in ("killed", "peer_lost"))  # (a loss: another's end, the cause)
    if not own or any(e.completed for e in r.trace) or r.time is None or r.time > INIT_RACE_S:
        return None
    return r.time


def init_race_notes(ranks: Sequence[RankResult], generations: int) -> list[str]:
    """The notes of the ranks that may lose the init connect race (the module's docstring),
    each against the first rank to leave early; none unless the world had one generation."""
    if generations != 1:
        return []
    early = sorted((t, r.rank) for r in ranks if (t := _left_early(r)) is not None)
    if not early:
        return []
    at, left = early[0]
    return [init_race_note(r.rank, left, at) for r in ranks
            if r.rank != left and not any(e.completed and e.t_done is not None and e.t_done <= at for e in r.trace)]


def noted_init_races(sim: Report) -> dict[int, int]:
    """The ranks the simulated report's notes put in the init connect race (`init_race_note`):
    rank -> the rank that left early."""
    return {int(m.group(1)): int(m.group(2)) for m in map(_NOTE.match, sim.notes) if m}


@dataclass(frozen=True)
class InitRace:
    """Rank `rank`, noted against rank `left`, ended on real Gloo as the init connect race makes
    it: `how` is "connect" (it failed connecting init's full mesh with `left`'s closure), "lost"
    (it lost a peer that had failed so) or "agent" (torchrun's agent ended it once one had)."""

    kind: ClassVar[str] = "init_connect"
    rank: int
    left: int
    how: str

    def describe(self) -> str:
        what = {"connect": "it failed connecting init's full mesh with that closure (\"Gloo connectFullMesh failed "
                           "with ... Connection closed by peer\")",
                "lost": "it lost a rank that had failed connecting so",
                "agent": "torchrun's agent ended it once a rank had failed connecting so"}[self.how]
        return (f"rank {self.rank}: init connect race, not a model difference: rank {self.left} left right after "
                f"init_process_group, and on real Gloo a rank was still connecting its side of a pair with it: {what}; "
                f"the simulator connects the world at once")


def init_races(sim: Report, real: Report, cmp: Comparison) -> list[InitRace]:
    """The init connect races that make up every difference of `cmp` (the module's docstring):
    every differing rank noted, each ended one of the race's ways, at least one the racer. Empty
    when the runs agree or anything else differs."""
    noted = noted_init_races(sim)

    def namer(sims: dict[int, RankResult], reals: dict[int, RankResult], rank: int,
              differ: set[str]) -> InitRace | None:
        s, r = sims[rank], reals.get(rank)
        if rank not in noted or r is None or not differ <= STOPPED_FIELDS or not stopped_short(s, r):
            return None
        lost = r.error is not None and r.error.category == "peer_lost"
        if lost and CONNECT_CLOSED.search(r.error.message) and not r.trace:  # type: ignore[union-attr]
            return InitRace(rank, noted[rank], "connect")
        if lost:
            return InitRace(rank, noted[rank], "lost")
        if r.exit is not None and r.exit.startswith(AGENT_TERMINATED):
            return InitRace(rank, noted[rank], "agent")
        return None

    races = every_differing_rank(sim, real, cmp, namer)
    return races if any(x.how == "connect" for x in races) else []
