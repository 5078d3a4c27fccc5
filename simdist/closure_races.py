"""Races of a peer's pair closure against a rank's own next event, two kinds beside those of
`simdist.races`: a timeout's closure against a peer's near deadline (`TieRace`), an abort's
reset against a peer's read of its block (`ResetRace`). In both the simulator gives the
unloaded host's order and the simulated report notes the ranks where real Gloo may go the
other way (`tie_race_note`, `reset_race_note`); a real run that differs only so, on noted ranks
only, is that race (`tie_races`, `reset_races`), not a model difference.

The tie race. When nothing can progress, the simulator fires the earliest Gloo deadline with
every one of its group due within `deadlines.TIE_S` of it: all of them time out
(`deadlines.next_due`). On real Gloo the earliest rank's timeout closes its pairs in the group
at once (the timeout's own closure: its process still lives), and a peer whose own deadline
comes a few milliseconds later meets that closure first when it reaches it before its
deadline: "Connection closed by peer" instead of its own timeout. Which comes first is the
host's: deadlines the simulated clocks put a fraction of a millisecond apart are apart on the
host by what each rank did before its wait (the end of the operation before, a print, a few
tensor ops), which the load stretches either way, and the closure takes milliseconds to reach
the other (both threads must run): under load either rank of the pair was seen to lose the
other's closure. Measured, torch 2.13, 3 ranks, rank 1 all-reducing 5 floats where ranks 0
and 2 give 4 (`tests/scripts/rank_failures.py --case mismatch --pg-timeout 3`; rank 1's
deadline 0.09 ms earlier on the simulated clocks): docs/script-backend.md, "Races of the real
run", with `bench/tie_closure_probe.py` (plain torchrun) and `bench/race_tally.py` (simdist's
real side). So the simulated report notes each rank whose tied timeout came within
`TIE_RACE_S` of another one of its group, before or after it (for a send or receive: its
peer's; which peer a collective's rank waits on at its step of Gloo's algorithm is not
modelled), and a real run in which such a rank failed with a lost peer where the
simulator has it time out, differing in nothing else, is the race. Beyond `TIE_RACE_S` the
closure reaches a later rank that waits on the earlier one every time (`deadlines.CLOSURE_S`'s
measurements): there it is the model's approximation (`deadlines.TIE_S`), no race, and a real
closure stays a difference.

The reset race. A rank that aborts in a collective (Gloo's I/O thread reads a message longer
than the receive posted for it: SIGABRT) dies with unread bytes on its sockets, so the kernel
resets its connections; a peer that had not yet read the aborting rank's own block of that
collective loses it to the reset ("Read error ... Connection reset by peer") and fails in the
collective, where the simulator, whose messages move at once, has it read the block and fail
only at its next operation with the rank (`tests/scripts/alltoallv_split_sizes.py`, 2 ranks:
docs/script-backend.md, "Races of the real run"). So the simulated report notes each rank that
completed the collective an aborted rank ended in, and a real run in which such a rank failed
with a lost peer in that very collective, having done and printed only what the simulator has
it do first, while that rank aborted on real Gloo too, is the race.

A module of its own, as `simdist.agent_race`: it imports only the shared walk
(`simdist.race_walk`), and `simdist.races` and the report's build import it.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar

from simdist.compare import Comparison
from simdist.race_walk import every_differing_rank, failed_after_last
from simdist.report import RankResult, Report
from simdist.vocab import P2P_OPS

# The band of a later tied deadline in which real Gloo went either way: own timeout at a gap of
# ~0, the closure at 5 ms (2 of 2), 10 ms (1 of 2), 20 ms and more every time (`deadlines.CLOSURE_S`,
# `tests/scripts/closure_first.py`); a collective under load: docs/script-backend.md, the tie race.
TIE_RACE_S = 0.02
_NOTE = re.compile(r"^rank (\d+): tie race: its Gloo timeout and rank (\d+)'s, in the same group, came ([\d.]+) ms apart")


def tie_race_note(rank: int, gap_s: float, other: int) -> str:
    """The simulated report's note for a rank whose tied timeout came `gap_s` (at most
    `TIE_RACE_S`) before or after rank `other`'s, in the same group."""
    return (f"rank {rank}: tie race: its Gloo timeout and rank {other}'s, in the same group, came {gap_s * 1000:.2f} ms "
            f"apart on the simulated clocks; the simulator times both out together, while on real Gloo the first to "
            f"time out closes its pairs and that closure may reach the other before its own deadline (\"Connection "
            f"closed by peer\"), whichever of the two the host's scheduling makes first")


def tie_race_notes(expired: Sequence[Any]) -> list[str]:
    """The notes of the ranks whose timeout (`expired`: the waits Gloo's timeout ended, in
    order, `simdist.script.deadlines.Expiry`s) came within `TIE_RACE_S` of another rank's in
    the same group, before or after it (a send's or receive's: its peer's only), each against
    the nearest such."""
    notes = []
    for x in expired:
        near = [y for y in expired if y.rank != x.rank and y.entry.group == x.entry.group
                and abs(x.deadline - y.deadline) <= TIE_RACE_S and (x.entry.op not in P2P_OPS or x.entry.peer == y.rank)]
        if near:
            other = min(near, key=lambda y: (abs(x.deadline - y.deadline), y.rank))
            notes.append(tie_race_note(x.rank, abs(x.deadline - other.deadline), other.rank))
    return notes


def noted_tie_races(sim: Report) -> dict[int, tuple[int, float]]:
    """The ranks the simulated report's notes put in a tie race (`tie_race_note`): rank -> (the
    rank whose timeout came nearest its own, the gap in seconds)."""
    return {int(m.group(1)): (int(m.group(2)), float(m.group(3)) / 1000) for m in map(_NOTE.match, sim.notes) if m}


@dataclass(frozen=True)
class TieRace:
    """Rank `rank` timed out in the simulator, tied with rank `other`'s timeout `gap_s` away,
    and on real Gloo met a pair closure before its own deadline."""

    kind: ClassVar[str] = "tie"
    rank: int
    other: int
    gap_s: float

    def describe(self) -> str:
        return (f"rank {self.rank}: tie race, not a model difference: its Gloo timeout and rank {self.other}'s came "
                f"{self.gap_s * 1000:.2f} ms apart on the simulated clocks; on real Gloo a peer's timeout closed its "
                f"pairs and the closure reached this rank before its own deadline; the simulator times both out together")


def tie_races(sim: Report, real: Report, cmp: Comparison) -> list[TieRace]:
    """The tie races that make up every difference of `cmp`: each differing rank is noted
    (`noted_tie_races`), timed out in the simulator, lost a peer on real Gloo, and differs in
    its error only (the same operations, lines and place), and some real rank timed out
    (whose closure it met). Empty when the runs agree or anything else differs."""
    noted = noted_tie_races(sim)
    if not any(r.error is not None and r.error.category == "timeout" for r in real.ranks):
        return []  # a closure comes from a timeout: one of the real ranks timed out

    def namer(sims: dict[int, RankResult], reals: dict[int, RankResult], rank: int,
              differ: set[str]) -> TieRace | None:
        s, r = sims[rank], reals.get(rank)
        if rank not in noted or r is None or differ != {"error"} or s.error is None or r.error is None:
            return None
        if (s.error.category, r.error.category) != ("timeout", "peer_lost"):
            return None
        other, gap = noted[rank]
        return TieRace(rank, other, gap)

    return every_differing_rank(sim, real, cmp, namer)


_RESET_NOTE = re.compile(r"^rank (\d+): reset race: it read rank (\d+)'s block in #(\d+) (\S+) on (\S+),")


def reset_race_note(rank: int, aborted: int, seq: int, op: str, group: str) -> str:
    """The simulated report's note for a rank that completed #`seq` `op` on `group`, in which
    rank `aborted` aborted."""
    return (f"rank {rank}: reset race: it read rank {aborted}'s block in #{seq} {op} on {group}, in which rank "
            f"{aborted} aborted; on real Gloo the abort resets rank {aborted}'s connections and may do so before this "
            f"rank has read the block: it then fails in #{seq} with the peer gone")


def reset_race_notes(ranks: Sequence[RankResult]) -> list[str]:
    """The notes of the ranks that completed the collective an aborted rank (its Gloo I/O
    thread threw: `gloo_abort`) ended in, its last operation (a send or receive has one
    peer, which `simdist.races.SendBandRace` is about: not here)."""
    notes = []
    for a in ranks:
        if a.status != "aborted" or a.error is None or a.error.category != "gloo_abort" or not a.trace:
            continue
        x = a.trace[-1]
        if x.op in P2P_OPS:
            continue
        for r in ranks:
            if r.rank != a.rank and any(e.group == x.group and e.seq == x.seq and e.op == x.op and e.completed
                                        for e in r.trace):
                notes.append(reset_race_note(r.rank, a.rank, x.seq, x.op, x.group))
    return notes


def noted_reset_races(sim: Report) -> dict[int, tuple[int, int, str, str]]:
    """The ranks the simulated report's notes put in a reset race (`reset_race_note`): rank ->
    (the aborted rank, the collective's sequence number, op and group)."""
    return {int(m.group(1)): (int(m.group(2)), int(m.group(3)), m.group(4), m.group(5))
            for m in map(_RESET_NOTE.match, sim.notes) if m}


@dataclass(frozen=True)
class ResetRace:
    """Rank `rank` read rank `aborted`'s block of #`seq` `op` in the simulator and failed only
    later; on real Gloo the abort's reset came first and it failed in #`seq`."""

    kind: ClassVar[str] = "reset"
    rank: int
    aborted: int
    seq: int
    op: str

    def describe(self) -> str:
        return (f"rank {self.rank}: reset race, not a model difference: rank {self.aborted} aborted in #{self.seq} "
                f"{self.op}; on real Gloo its abort reset the connection before this rank had read its block, and "
                f"it failed in #{self.seq} with the peer gone; the simulator has it read the block first")


def reset_races(sim: Report, real: Report, cmp: Comparison) -> list[ResetRace]:
    """The reset races that make up every difference of `cmp`: each differing rank is noted
    (`noted_reset_races`), failed with a lost peer on real Gloo in the noted collective, which
    the simulator completes, having done and printed only what the simulator has it do first
    (`race_walk.failed_after_last`), and the aborted rank aborted on real Gloo too. Empty when
    the runs agree or anything else differs."""
    noted = noted_reset_races(sim)

    def namer(sims: dict[int, RankResult], reals: dict[int, RankResult], rank: int,
              differ: set[str]) -> ResetRace | None:
        r = reals.get(rank)
        if rank not in noted or r is None:
            return None
        aborted, seq, op, group = noted[rank]
        if (last := failed_after_last(sims[rank], r, differ, "peer_lost")) is None:
            return None
        at, _ = last
        gone = reals.get(aborted)
        if (at.seq, at.op, at.group) != (seq, op, group) or gone is None or gone.status != "aborted":
            return None
        return ResetRace(rank, aborted, seq, op)

    return every_differing_rank(sim, real, cmp, namer)
