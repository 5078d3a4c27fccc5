"""The race of `mp.spawn`'s teardown (`SpawnRace`, `spawn_races`), a ninth kind beside those of
`simdist.races`.

`torch.multiprocessing.spawn` (and `start_processes`) waits in its parent on its children's
sentinels (`ProcessContext.join`, torch/multiprocessing/spawn.py); once one has exited with a
non-zero status it SIGTERMs every child still alive at once (`mp.spawn` passes no grace
period), then raises `ProcessRaisedException`. The same exit closes the failed child's Gloo
sockets, so a peer with an operation pending with it is told "Connection closed by peer".
Both start at that one exit: the parent wakes on the sentinel, joins the child and sends the
signal; the peer's Gloo thread reads the closure, its operation raises, `mp.spawn`'s wrapper
writes the traceback and the process exits, reporting how. Which reaches the peer first is the
host's: killed with no word (SIGTERM), or failed with the lost peer in that operation. The
simulated ranks run the script's own `mp.spawn`, so the simulated side races the same way
(through the coordinator: the peer's loss is one more hop), and no simulated clock orders the
two. Measured, torch 2.13 (`python bench/race_tally.py examples/spawn_init_methods.py --n 10 --
--fail 1`, worker 1 raises with worker 0 in DDP's all_reduce): real Gloo 13 killed / 7 lost
the peer of 20 at load 6-12; the simulated side itself 12 / 3 of 15 at load 3-8
(docs/script-backend.md, "Races of the real run").

So the simulated report notes each rank that had an operation pending with the first mp.spawn
child to fail when that child ended (`spawn_race_notes`), and a real run in which such a rank
ended the other way (killed where the simulator has it lose the peer in that operation, or
the reverse), having done and printed only what it did the first way, while the failed child
failed on real Gloo too, is the race. A rank that was not waiting on the failed child (it
computed, or waited on another rank) is not noted: the SIGTERM comes within milliseconds, and
what it would have met later is no race of this window.

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
from simdist.race_walk import STOPPED_FIELDS, every_differing_rank, failed_at, lost_peer, stopped_short
from simdist.report import RankResult, Report, TraceEntry
from simdist.vocab import P2P_OPS

KILLED, LOST = "killed", "peer_lost"  # the two ends of a noted rank (error categories)
_NOTE = re.compile(r"^rank (\d+): spawn race: its #(\d+) (\S+) on (\S+) was pending with rank (\d+)")


def spawn_race_note(rank: int, failed: int, pending: TraceEntry) -> str:
    """The simulated report's note for rank `rank`, whose operation `pending` waited on rank
    `failed` (an mp.spawn child that failed first) when `failed`'s process ended."""
    return (f"rank {rank}: spawn race: its #{pending.seq} {pending.op} on {pending.group} was pending with rank "
            f"{failed} when rank {failed}'s process (an mp.spawn child) ended with an error; mp.spawn's parent then "
            f"SIGTERMs every other child (ProcessContext.join) while Gloo's closure reaches this rank from that same "
            f"exit: on real Gloo, as on the simulated side, either may come first (killed with no word, or "
            f"\"Connection closed by peer\" in #{pending.seq})")


def spawn_race_notes(ranks: Sequence[RankResult], spawned: frozenset[int]) -> list[str]:
    """The notes of the ranks that had an operation pending with the first rank to fail among
    `spawned` (the ranks that told they ended with an error as mp.spawn children; a rank that
    lost a peer failed when the peer ended, `race_walk.failed_at`): each rank
    killed with no word whose last operation, unfinished, is in a group with that rank, or
    that lost that very rank in its last operation (`race_walk.lost_peer`)."""
    by_rank = {r.rank: r for r in ranks}
    failed = [r for r in ranks if r.rank in spawned and r.status == "error" and r.time is not None]
    if not failed:
        return []
    # when each failed (a loss: when its peer ended); at a tie, one that failed on its own first
    first = min(failed, key=lambda r: (failed_at(by_rank, r.rank), lost_peer(r) is not None, r.rank))
    groups = {e.group for e in first.trace}
    notes = []
    for r in ranks:
        last = r.trace[-1] if r.trace and r.error is not None else None
        if r is first or last is None or last.group not in groups or last.op in P2P_OPS and last.peer != first.rank:
            continue
        killed = r.error.category == KILLED and not last.completed  # type: ignore[union-attr]
        if killed or r.error.category == LOST and lost_peer(r) == first.rank:  # type: ignore[union-attr]
            notes.append(spawn_race_note(r.rank, first.rank, last))
    return notes


def noted_spawn_races(sim: Report) -> dict[int, tuple[int, int, str, str]]:
    """The ranks the simulated report's notes put in a spawn race (`spawn_race_note`): rank ->
    (the failed rank, the pending operation's sequence number, op and group)."""
    return {int(m.group(1)): (int(m.group(5)), int(m.group(2)), m.group(3), m.group(4))
            for m in map(_NOTE.match, sim.notes) if m}


@dataclass(frozen=True)
class SpawnRace:
    """Rank `rank` waited on rank `failed` in #`seq` `op` when `failed`, an mp.spawn child,
    ended with an error; `sim_killed`: mp.spawn's SIGTERM came first on the simulated side and
    Gloo's closure on the real one, else the other way round."""

    kind: ClassVar[str] = "spawn"
    rank: int
    failed: int
    seq: int
    op: str
    sim_killed: bool

    def describe(self) -> str:
        sim, real = ("killed", "lost the peer") if self.sim_killed else ("lost the peer", "killed")
        return (f"rank {self.rank}: spawn race, not a model difference: it waited on rank {self.failed} in "
                f"#{self.seq} {self.op} when rank {self.failed}'s process (an mp.spawn child) ended with an error; "
                f"mp.spawn's SIGTERM and Gloo's closure both start at that exit, and the simulated rank {sim} "
                f"first where the real one {real}")


def spawn_races(sim: Report, real: Report, cmp: Comparison) -> list[SpawnRace]:
    """The spawn races that make up every difference of `cmp` (the module's docstring). Empty
    when the runs agree or anything else differs."""
    noted = noted_spawn_races(sim)

    def namer(sims: dict[int, RankResult], reals: dict[int, RankResult], rank: int,
              differ: set[str]) -> SpawnRace | None:
        s, r = sims[rank], reals.get(rank)
        if rank not in noted or r is None or not differ <= STOPPED_FIELDS or s.error is None or r.error is None:
            return None
        failed, seq, op, group = noted[rank]
        gone, own = reals.get(failed), sims.get(failed)
        if gone is None or gone.status != "error" or gone.error is None or own is None or own.error is None or \
                (gone.error.category == KILLED) != (own.error.category == KILLED):
            return None  # the failed child failed its own way on real Gloo too (killed: by its own signal on both)
        if (s.error.category, r.error.category) == (KILLED, LOST):
            killed, lost = s, r
        elif (s.error.category, r.error.category) == (LOST, KILLED):
            killed, lost = r, s
        else:
            return None
        at = lost.trace[-1] if lost.trace else None
        if at is None or (at.seq, at.op, at.group) != (seq, op, group):
            return None  # the peer is lost in the noted operation, nowhere else
        # the killed side did and printed a beginning of the other's (a real one killed keeps no
        # operations); a simulated one killed did and printed just what the real one that lost the peer did
        same = [e.key() for e in r.trace] == [e.key() for e in s.trace] and r.output == s.output
        if not stopped_short(lost, killed) or killed is s and not same:
            return None
        return SpawnRace(rank, failed, seq, op, killed is s)

    return every_differing_rank(sim, real, cmp, namer)
