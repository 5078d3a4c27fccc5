"""Gloo's timeouts on simulated ranks: deadlines in simulated time.

A real Gloo group ends every wait that outlasts its `timeout` (`init_process_group(...,
timeout=)`, `new_group(timeout=)`) with "Timed out waiting <T>ms for recv/send operation to
complete", and closes the rank's pairs in the group (`simdist.engine.timeouts`); the rank's
script then goes on (it usually raises and exits). Users set short timeouts precisely so
that a stuck run ends, so the simulator models them as discrete events: an operation gets a
deadline when it is issued (its rank's simulated clock plus the group's timeout;
`monitored_barrier`'s waits bring their own). A deadline fires when what the operation waits
for can no longer come in time: a rank it awaits is past the deadline on its own clock
without having posted (`overdue`: once no rank can post anything earlier, or when that rank
posts or leaves), or no rank can progress at all (the coordinator's hang test). The
operations due then fail with Gloo's error, their ranks' clocks move to the deadline, and
the run goes on. `Work.wait(timeout=)` adds a deadline to one wait only: it raises torch's
"Operation timed out!" and the operation goes on.

Gloo's are not the only waits with a deadline: a rank's init, a member's store wait in
`new_group`, the store-based barrier's wait end too. When no rank can progress, the one
whose deadline comes first in simulated time ends, whatever its kind (`Deadline`,
`next_due`: one chooser for all), and only it: the rank it frees may post what ends
the others' waits (torch 2.13, `tests/scripts/deadline_order.py`: rank 0's all_reduce times
out at 1 s and it then joins the new_group rank 1 waits in with a 3 s timeout; with the
timeouts the other way round rank 1's new_group raises at 1 s and it joins rank 0's
all_reduce). A rank blocked in a wait that its own deadline ends before another's counts as
one that may still post (`overdue`'s `freed`).

`TIE_S` treats deadlines within it of the earliest, in the same wait (`Deadline.scope`: a Gloo
op's group, a new_group's or a store barrier's key), as simultaneous: all of them fire (what
real Gloo does when ranks block together with one timeout, the usual case: within a group
the engine closes a timed-out rank's pairs at once, `Engine.time_out`, where on Gloo a
peer's own wait ends before the closure reaches it). One in another group is not tied: a
timeout reaches another group only through what its rank does next, at its clock (torch
2.13, `tests/scripts/tie_groups.py`: rank 0's all_reduce times out at 1 s and it sends, on
another group, to rank 1, whose receive there would time out at 1.3 s: rank 1 receives; tied,
its receive timed out and rank 0's send met its closure). Nor is a send or receive whose
peer is due earlier by more than `CLOSURE_S` (`Deadline.peers`): the peer's closure reaches
it first (`tests/scripts/closure_first.py`). For a collective it is an
approximation with no measured window behind it: on real Gloo whether a later deadline
times out on its own or first meets a timed-out peer's pair closure depends on which peer
its rank waits on at that step of Gloo's algorithm, which the engine does not model (the
measurements: docs/script-backend.md, "Near ties"). Within `closure_races.TIE_RACE_S` of
each other, which of two tied timeouts comes first is the host's (either rank may meet the
other's closure): the report notes such ranks a tie race (`closure_races.tie_race_notes`).
A send's or receive's deadline is armed when its rank waits for it (`RankConn.waited_on`). Torch's default timeout (30 min) is no way
out of a stuck run: a run that would sit for 30 minutes is reported as the hang it is, at once
(`OpRecord.long`); its deadline fires only when simulated time gets there, a rank's clock past
it or threads in timed waits woken up to it (`simdist.script.timedwakes`).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from simdist.report import TraceEntry

TIE_S = 0.5  # deadlines this close to the earliest fire with it (see the module's docstring)
# ... but a send's or receive's whose peer timed out earlier by more than this: the peer's
# pair closure reaches it first (measured, torch 2.13, 2 ranks: `docs/script-backend.md`,
# "Near ties": own timeout at a gap of ~0 s, 5 of 5; the closure at 0.005 s 2 of 2, at
# 0.01 s 1 of 2, at 0.02-0.3 s 5 of 5). Above the simulated clocks' skew when ranks block
# at once (0.02-0.2 ms measured), below the band where the closure won.
CLOSURE_S = 0.002


@dataclass
class Expiry:
    """One operation that Gloo's timeout ended: for the report's account of the hang it ended."""

    rank: int
    entry: TraceEntry
    frames: list[Any]  # raw frames of the rank's blocked thread (or of the call)
    deadline: float  # on the rank's simulated clock
    limit_s: float
    message: str


def message(op: str, limit_s: float) -> str:
    """Gloo's error for a wait that outlasted `limit_s` (its file-and-line prefix left out,
    as the simulator's other Gloo messages do). Which of "recv"/"send" a collective names
    depends on the step of Gloo's algorithm it was in and the direction of the message its
    rank waits for there, which the engine does not model: the simulator says "recv" for
    collectives (docs/script-backend.md)."""
    kind = "send" if op == "send" else "recv"
    return f"Timed out waiting {round(limit_s * 1000)}ms for {kind} operation to complete"


WAIT_TIMED_OUT = "Operation timed out!"  # torch's Work::wait(timeout) when the op is still running


@dataclass(frozen=True)
class Deadline:
    """One wait that ends at simulated time `at` unless what it waits for comes first: a Gloo
    operation's (`kind` "gloo"), a `Work.wait(timeout=)`'s ("wait"), a rank's init's, a
    member's in `new_group`'s store wait, a rank's in the store-based barrier. Every kind
    goes through one chooser (`next_due`), so they fire in the order of simulated time
    whatever their kind: a rank a deadline frees may post what ends a later one's wait.
    `conn`: the rank connection that waits; `item`: what `fire` needs to end the wait; `fire`
    ends a batch of one kind's items; `scope`: the wait it shares with others, the only ones
    it ties with (`TIE_S`; None: every one of its kind); `peers`: the ranks whose pair
    closure ends it at once (a send's or receive's peer; None: not known, a collective's)."""

    at: float
    rank: int
    kind: str
    conn: Any = field(compare=False)
    item: Any = field(compare=False)
    fire: Callable[[list[Any]], None] = field(compare=False)
    scope: Any = field(default=None, compare=False)
    peers: frozenset[int] | None = field(default=None, compare=False)


def next_due(pending: Sequence[Deadline]) -> list[Deadline]:
    """What fires next of `pending`: the earliest deadline (the lowest rank at a tie) and every
    one of its kind and scope within `TIE_S` of it, earliest first. One of another kind fires only at a
    later call, once the run is stuck again: the ranks the first frees may end it before. A
    `Work.wait(timeout=)` due before any op's deadline fires alone (it ends only the wait).
    One whose `peers` hold a rank of the batch due more than `CLOSURE_S` before it is left
    out: that rank's timeout closes its pair first (`Engine.time_out` fails it so)."""
    if not pending:
        return []
    first = min(pending, key=lambda d: (d.at, d.rank))
    batch: list[Deadline] = []
    for d in sorted((d for d in pending if _tied(d, first.kind, first.scope) and d.at <= first.at + TIE_S),
                    key=lambda d: (d.at, d.rank)):
        if not d.peers or not any(b.rank in d.peers and d.at > b.at + CLOSURE_S for b in batch):
            batch.append(d)
    return batch


def _tied(d: Deadline, kind: str, scope: Any) -> bool:
    return d.kind == kind and d.scope == scope


def fire_next(pending: Sequence[Deadline]) -> bool:
    """End the waits `next_due` picks; whether there were any (False: no deadline is left)."""
    batch = next_due(pending)
    if batch:
        batch[0].fire([d.item for d in batch])
    return bool(batch)


def frees_before(pending: Sequence[Deadline], at: float, kind: str, scope: Any = None) -> bool:
    """Whether one of a blocked rank's deadlines (`pending`) ends its wait before `at`, so it
    may post before then: one of another kind or scope earlier than `at`, or one of `kind`
    and `scope` earlier by more than `TIE_S` (one closer fires with the deadline at `at`, `next_due`)."""
    return any(d.at < at - (TIE_S if _tied(d, kind, scope) else 0.0) for d in pending)


def overdue(awaits: Any, call: Any, at: float, owner: Any, live: list[Any], posting: Any = None,
            freed: Callable[[Any], bool] = lambda c: False) -> bool:
    """Whether `owner`'s `call` (waiting until simulated time `at`) runs out before what it
    waits for can come: a live rank it `awaits` is past `at` without having posted it, and
    either that rank is `posting` now (its post comes too late) or no rank can still post
    anything before `at` (each is past it, leaving, or blocked -- or blocked but for threads in
    timed waits that wake after `at`, `RankConn.wake_at` -- and not `freed` before `at` by a
    deadline of its own: `frees_before`), so the timeout at `at` acts on no earlier post."""
    late = [c for c in live if c is not owner and c.clock > at and awaits(call, c.rank)]
    return bool(late) and (posting in late or all(c.clock >= at or (_still_at(c, at) and not freed(c)) or c.exit is not None
                                                  for c in live))


def _still_at(conn: Any, at: float) -> bool:
    """Nothing of the rank can post before simulated time `at`: it is blocked, or blocked but for
    threads in timed waits (`rank.timedwait`) the first of which wakes after `at`."""
    return bool(conn.blocked() or ((wake := conn.wake_at()) is not None and wake > at))
