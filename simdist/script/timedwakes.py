"""Threads in timed waits carry a stuck run forward in simulated time, to its Gloo deadline.

A progress bar's thread (tqdm's monitor loops on `Event.wait(10)`, rich's refresh thread on
`Event.wait(0.1)`) can post nothing before its timer ends (`rank.timedwait`), but may when it
wakes, so a rank blocked but for such threads is not hung. With a group timeout shorter than
the thread's next wake the deadline fires first (`GlooTimeoutsMixin._expire_before_wakes`);
with torch's default (30 min for Gloo) real ranks raise "Timed out waiting 1800000ms ..." after
30 min, while the simulator used to sit until its watchdog: every wake lay before the deadline,
and it waited for each in wall time.

Now, once every live rank is blocked but for threads in timed waits and no deadline comes
before the first of them wakes, the coordinator wakes that thread at once (`"wake"`): its wait
returns as its timer would have ended it, with its process's clocks moved to the wait's end
(`rank.simclock`) and every other live rank's by as much (`scriptclocks`), and what the thread does then is the program's (it may post, print, wait
again). Each wake moves the thread's timeline on by its wait (`RankConn.timed_wait`), so the
loop runs simulated time forward until a thread posts or a deadline, the default timeout's
too (`OpRecord.long`), comes before the next wake: about 180 wakes for tqdm's 10 s monitor to
30 min, in seconds of wall time. One wake is in flight at a time: the next waits for the
rank's answer (the thread's "woke", then its next wait or its end).

A thread that wakes too often to get there (rich's 10 a second is 18 000 wakes to 30 min; one
that waits 1 ms, 1.8 million) is woken at most `MAX_WAKES` times a run: after that its timers
run in wall time again, as before (a deadline it passes still fires; torch's default is then
left to the watchdog), and the report says so (`wake_notes`).

A `time.sleep` is not woken while any live rank's process has a child process (a `Popen`, a
DataLoader's workers): a loop that sleeps may be polling what the child makes in wall time (a
file it writes, its exit), and a peer's may poll a file a rank's child writes, so running its
timers forward would let it give up, or a peer's Gloo timeout fire, before the child is done
(tests/scripts/polls_peer_child.py: rank 1 polls every 0.1 s for a file rank 0's child writes
after 2 s while rank 0 waits in a barrier with a 10 s timeout; the simulator raised the
timeout). Its timer ends it in wall time then, as it did before sleeps were timed waits; the
rank's main thread's sleep is told only where its own process has no child (`rank.timedwait`).
"""

from __future__ import annotations

from typing import Any

from simdist.procs import has_children
from simdist.script.ranks import RankConn

# Wakes the coordinator makes a run at most. Measured (docs/script-backend.md, "Hangs, at once":
# a thread in a timed wait) at 0.6 ms a wake on an idle 2-core host, 1.2-2.5 ms under load 8-10:
# 20 000 is 12-50 s of wall time at most, enough for one 10-a-second refresh thread to reach 30 min.
MAX_WAKES = 20_000


class TimedWakesMixin:
    """Needs from the class it is mixed into: `_live()`, `_send()` and `_skip()` (see `Coordinator`)."""

    _live: Any
    _send: Any
    _skip: Any
    _waking: tuple[RankConn, int | None, int] | None = None  # the wake in flight: rank, thread key, wait number
    wakes_made = 0
    wakes_capped: tuple[RankConn, int | None, float, float] | None = None  # where the cap stopped them

    def _wake_first(self) -> None:
        """Every live rank is blocked but for threads in timed waits and no deadline comes before
        the first wakes (`_expire_before_wakes`): wake it now, unless a wake is still in flight."""
        if self._waking is not None and not _answered(*self._waking):
            return
        self._waking = None
        first = min(((c, k, w) for c in self._live() if c.wake_at() is not None
                     for k in c.claim.timed if (w := c.wakes.get(k)) is not None),
                    key=lambda ckw: (ckw[2], ckw[0].rank), default=None)
        if first is None:
            return
        conn, key, at = first
        if key in conn.sleepers and any(has_children(c.pid) for c in self._live() if c.pid is not None):
            return  # (a sleep may be polling a child's progress, which only the wall clock makes: its timer ends it)
        if self.wakes_made >= MAX_WAKES:
            if self.wakes_capped is None:
                self.wakes_capped = (conn, key, at, at - conn.timers_at.get(key, conn.clock))
            return
        self.wakes_made += 1
        self._waking = (conn, key, conn.wait_numbers.get(key, 0))
        self._send(conn, {"t": "wake", "tid": key, "n": self._waking[2]})
        self._skip(conn, conn.wait_ends.get(key), told=True, at=at)  # every live rank's clocks move on with it (`scriptclocks`)

    def wake_notes(self) -> list[str]:
        """The report's word on the wakes: how many, and where the cap stopped them."""
        if self.wakes_capped is None:
            return []
        conn, _key, at, every = self.wakes_capped
        return [f"timed waits: the simulator woke threads in timed waits {self.wakes_made} times in simulated time "
                f"(the most it does in a run) while every rank was blocked; a thread of rank {conn.rank} waking "
                f"every {every:g} s was still due at t={at:.3f} s, so its timers ran in wall time from then on: a Gloo "
                "timeout that its wakes would have reached (torch's default, 30 min) is left to the watchdog"]


def _answered(conn: RankConn, key: int | None, number: int) -> bool:
    """The rank has answered a wake of its thread's wait `number`: the wait is over (its "woke"),
    another began, the thread no longer waits, or the process is gone."""
    return (not conn.connected or key not in conn.wakes or conn.wait_numbers.get(key) != number
            or key not in conn.claim.timed)
