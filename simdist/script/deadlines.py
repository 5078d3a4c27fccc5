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
posts or leaves), or no rank can progress at all (the coordinator's hang test: `due`). The
operations due then fail with Gloo's error, their ranks' clocks move to the deadline, and
the run goes on. `Work.wait(timeout=)` adds a deadline to one wait only: it raises torch's
"Operation timed out!" and the operation goes on.

`TIE_S` treats deadlines within it of the earliest as simultaneous: all of them fire (what
real Gloo does when ranks block together with one timeout, the usual case). It is an
approximation with no measured window behind it: on real Gloo whether a later deadline
times out on its own or first meets a timed-out peer's pair closure depends on which peer
its rank waits on at that step of Gloo's algorithm, which the engine does not model (the
measurements: docs/script-backend.md, "Near ties"). A send's or receive's deadline is armed
when its rank waits for it (`RankConn.waited_on`). Torch's default timeout (30 min) is not
modelled: a run that would sit for 30 minutes is reported as the hang it is, at once (the
rank layer sends a group's timeout only when it is shorter, `rank.backend.create`).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from simdist.report import TraceEntry

TIE_S = 0.5  # deadlines this close to the earliest fire with it (see the module's docstring)


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


def first_deadline(pending: list[tuple[Any, Any]], waits: list[tuple[Any, Any, float]] = ()) -> float | None:
    """The earliest of `due`'s deadlines: the records' (those that have one) and the waits'; None: none."""
    return min([r.deadline for _, r in pending if r.deadline is not None] + [u for _, _, u in waits], default=None)


def due(pending: list[tuple[Any, Any]], waits: list[tuple[Any, Any, float]] = ()) -> tuple[list, list]:
    """What fires next of `(conn, rec)` pairs whose record has a deadline (the op's own or its
    group's) and `(conn, rec, until)` waits with their own timeout (`Work.wait(timeout=)`):
    the earliest and every one within `TIE_S` of it, as (ops, waits). A wait's timeout ends
    only the wait (torch raises "Operation timed out!", the op goes on); one due before any
    op's deadline fires alone."""
    timed = [(c, r) for c, r in pending if r.deadline is not None]
    first = first_deadline(timed, waits)
    if first is None:
        return [], []
    first_wait = min((u for _, _, u in waits), default=None)
    if first_wait is not None and first_wait == first:
        return [], sorted(((c, r, u) for c, r, u in waits if u <= first + TIE_S), key=lambda w: (w[2], w[0].rank))
    return sorted(((c, r) for c, r in timed if r.deadline <= first + TIE_S), key=lambda cr: (cr[1].deadline, cr[0].rank)), []


def overdue(awaits: Any, call: Any, at: float, owner: Any, live: list[Any], posting: Any = None) -> bool:
    """Whether `owner`'s `call` (waiting until simulated time `at`) runs out before what it
    waits for can come: a live rank it `awaits` is past `at` without having posted it, and
    either that rank is `posting` now (its post comes too late) or no rank can still post
    anything before `at` (each is past it, blocked or leaving), so the timeout at `at` acts
    on no earlier post."""
    late = [c for c in live if c is not owner and c.clock > at and awaits(call, c.rank)]
    return bool(late) and (posting in late or all(c.clock >= at or c.blocked() or c.exit is not None for c in live))
