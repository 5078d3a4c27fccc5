"""Gloo's timeouts on simulated ranks: deadlines in simulated time.

A real Gloo group ends every wait that outlasts its `timeout` (`init_process_group(...,
timeout=)`, `new_group(timeout=)`) with "Timed out waiting <T>ms for recv/send operation to
complete"; the rank's script then goes on (it usually raises and exits, and its peers see
their own timeouts or its exit). Users set short timeouts precisely so that a stuck run ends,
so the simulator models them as discrete events: an operation gets a deadline when it is
issued (its rank's simulated clock plus the group's timeout; `monitored_barrier`'s waits
bring their own). Nothing else can end a wait, so when no rank can progress (the
coordinator's hang test), the next event is the earliest deadline: the operations due then
fail with Gloo's error, their ranks' clocks move to the deadline, and the run goes on.

A timed-out rank needs time to raise, unwind and close its sockets before its peers can
notice its exit; deadlines closer than that race on real Gloo. `TIE_S` treats deadlines
within it of the earliest as simultaneous: all of them fire (what real Gloo does when ranks
block together with one timeout, the usual case). Torch's default timeout (30 min) is not
modelled: a run that would sit for 30 minutes is reported as the hang it is, at once (the
rank layer sends a group's timeout only when it is shorter, `rank.pg.create`).
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
    depends on the step of Gloo's algorithm it was in: the simulator says "recv" for them."""
    kind = "send" if op == "send" else "recv"
    return f"Timed out waiting {round(limit_s * 1000)}ms for {kind} operation to complete"


def due(pending: list[tuple[Any, Any]]) -> list[tuple[Any, Any]]:
    """Of `(conn, rec)` pairs whose record has a deadline, those that fire next: the earliest
    and every one within `TIE_S` of it."""
    timed = [(c, r) for c, r in pending if r.deadline is not None]
    if not timed:
        return []
    first = min(r.deadline for _, r in timed)
    return sorted(((c, r) for c, r in timed if r.deadline <= first + TIE_S), key=lambda cr: (cr[1].deadline, cr[0].rank))
