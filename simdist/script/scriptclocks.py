"""The coordinator's side of the script's clocks (`rank.simclock`): which rank's clocks a skip of
simulated time moves, and by how much.

A rank's script clocks read the real clock plus an offset, the simulated time skipped for it
(`rank.simclock.advance_to`). Time is skipped only where the wall clock would have passed it for
every rank: when every live rank is blocked (but for threads in timed waits) and the coordinator
ends a wait at its deadline or wakes such a thread (`_expire_next`, `_expire_before_wakes`,
`TimedWakesMixin`), no rank does anything in wall time meanwhile, so every live rank's clocks
move on together (a rank blocked on the one that timed out reads, once freed, the time of that
timeout, as on real Gloo). A deadline that comes due while some rank still runs in wall time (a
peer's `time.sleep` moved its simulated clock past it) is not skipped to at all: it fires when
the wall clock gets there (`GlooTimeoutsMixin._overdue_in`, `reached`), so the timed-out rank's
clocks do not run ahead of its peers' and count the same wall time twice when it later waits for
them (measured: docs/script-backend.md, "Gloo's own timeout"). Only where a late rank posts
before the wall clock gets there (its simulated clock ran ahead by the cost model's time) does
the rank whose wait timed out skip alone. The waits at the c10d store that a deadline ends
(a group's creation, init's rendezvous) move the clocks as an op's does (`waited_to`: the
script's clock the request said, "p", plus the simulated time waited).

The coordinator keeps each rank's offset as it has sent it; CLOCK_MONOTONIC is one clock for
every process of the host, so the coordinator's `time.monotonic()` is the ranks' real one.
"""

from __future__ import annotations

import time
from typing import Any

from simdist.script.ranks import OpRecord, RankConn


def script_at(rec: OpRecord, at: float) -> float | None:
    """The script's monotonic clock (`rank.simclock.now`) at simulated time `at` of the rank that
    posted `rec`, on the clock it read at the post; None: the post did not say (`OpRecord.proc`)."""
    return waited_to(rec.proc, rec.entry.t_issue, at)


def waited_to(proc: float | None, entry: float, at: float) -> float | None:
    """The script's monotonic clock at simulated time `at` of a rank that entered a wait (an op,
    a group's creation, init) at simulated time `entry` reading `proc` (the message's "p"; None: not
    said, so unknown)."""
    return None if proc is None else proc + max(at - entry, 0.0)


class ScriptClocksMixin:
    """Needs from the class it is mixed into: `_live()` and `_send()` (see `Coordinator`)."""

    _live: Any
    _send: Any
    _standstill = False  # the deadlines firing now end a stand-still of every live rank (`_skip`)

    def _offset(self, conn: RankConn) -> float:
        return self.__dict__.setdefault("_offsets", {}).get(id(conn), 0.0)

    def reached(self, conn: RankConn, target: float | None) -> bool:
        """The rank's script clock has got to `target` (None: unknown, taken as got to)."""
        return target is None or time.monotonic() + self._offset(conn) >= target

    def _skip(self, conn: RankConn, target: float | None, *, told: bool = False, at: float | None = None) -> None:
        """`conn`'s script clock reads at least `target` from now on; in a stand-still (or
        `told`: a wake, which ends one) every live rank's moves on by as much, but a rank blocked
        in an op no further than that op's post plus the simulated time from it to `at` (the
        skip's simulated time; `_anchored`). `told`: the rank moves its own clocks
        (`rank.timedwait._wake`), only the others are sent theirs."""
        if target is None or (skip := target - (time.monotonic() + self._offset(conn))) <= 0:
            return
        offsets = self.__dict__.setdefault("_offsets", {})
        for c in self._live() if self._standstill or told else [conn]:
            end = None if c is conn else self._anchored(c, at)
            step = skip if end is None else min(skip, end - (time.monotonic() + self._offset(c)))
            if step <= 0:
                continue
            offsets[id(c)] = self._offset(c) + step
            if not (told and c is conn):
                self._send(c, {"t": "clock", "p": time.monotonic() + offsets[id(c)]})

    def _anchored(self, c: RankConn, at: float | None) -> float | None:
        """A rank blocked in an op: its script clock at simulated time `at`, its post's clock
        ("p") plus the simulated time since (`script_at`); None: not so blocked, or not known.
        The script clocks read the real clock, so the wall time any rank runs between its
        operations (a poll loop's turns between told sleeps, a process descheduled on a loaded
        host) passes on every rank's, while the simulated clocks, on which deadlines and wakes
        are ordered, count none of it under `--zero-compute` (only measured CPU otherwise). A
        stand-still's skip by the same amount for every rank counted that wall time for the
        blocked ones: a peer's 3 s timeout read 4 s once a sleeper's turns added up to 0.5 s
        (tests/scripts/main_sleeps_timeout.py, CI at load 15); now a blocked rank moves no further
        than this (never back)."""
        if at is None or c.block is None:
            return None
        ends = [e for i in c.block.ids if (rec := c.ops.get(i)) is not None and not rec.done
                and (e := script_at(rec, at)) is not None]
        return max(ends, default=None)
