"""Simulated side: a thread of the script in a timed wait tells the coordinator when it wakes.

A thread asleep in `threading.Condition.wait(timeout)` (so `Event.wait(t)`, `Queue.get(timeout=)`,
`Condition.wait_for`: tqdm's monitor loops on `Event.wait(10)`, rich's refresh thread on
`Event.wait(1/refresh)`) uses no CPU, yet may post an operation when its timer ends: it counts
as a thread that could post (`rank.threads`), so a rank with one is never blocked, and a run
whose main threads all wait in collectives that cannot complete was left to the watchdog, its
Gloo timeouts never fired. But until its timer ends such a thread can post nothing (a wake by
another thread of its process comes from a thread that runs, which the claim counts): each
timed wait is told to the coordinator (`"twait"`: its length, on the rank's simulated clock
from the thread's own compute, `RankConn.timed_wait`), and the rank's claim lists the threads
in one (`Client.claim`). A rank blocked but for such threads is blocked until the first of
them wakes (`RankConn.wake_at`): a deadline before that (a Gloo timeout, a `Work.wait(timeout=)`)
fires as it would with no such thread (`GlooTimeoutsMixin._expire_before_wakes`). A wait its
timer ended is told too (`"woke"`): the rank's clock is at least its end then, so a thread that
loops on a short timed wait moves the rank's clock on to a deadline as the wall clock does.

Installed on the simulated side only: on real Gloo the stall rule reads such threads' waits
from the kernel (`rank.stall`). Other timed waits (a `Lock.acquire(timeout=)`, `select`, a
socket's timeout, `time.sleep` on a side thread) are not seen: their threads count as running.
"""

from __future__ import annotations

import os
import sys
import threading
from typing import Any

from simdist.frames import SIMDIST_DIR as _SIMDIST
from simdist.script.rank import client
from simdist.script.rank.threads import OWN_PREFIX, SITE_DIR, STDLIB_DIR

_IN = threading.local()  # this thread is telling a timed wait already (no wait inside it is told)


def _simdists(frame: Any) -> bool:
    """The wait is simdist's own (the rank layer's `Work.wait` polls its events every 20 ms on
    the script's thread): the first caller outside the standard library is simdist's code."""
    while frame is not None:
        name = os.path.abspath(frame.f_code.co_filename)
        if not (frame.f_code.co_filename.startswith("<frozen ") or (name.startswith(STDLIB_DIR) and not name.startswith(SITE_DIR))):
            return name.startswith(_SIMDIST)
        frame = frame.f_back
    return False


def _waiters(cond: Any) -> list[int]:
    """The threads waiting on `cond`, in the order of its `_waiters` (every wait is told here,
    under the condition's lock, as it joins and leaves): `notify(n)` wakes the first n."""
    return cond.__dict__.setdefault("_simdist_waiters", [])


def install() -> None:
    orig, orig_notify = threading.Condition.wait, threading.Condition.notify

    def timed(self: Any, timeout: float | None) -> bool:
        c = client.CLIENT
        if (timeout is None or timeout <= 0 or c is None or getattr(_IN, "on", False)
                or threading.current_thread().name.startswith(OWN_PREFIX) or _simdists(sys._getframe(2))):
            return orig(self, timeout)
        _IN.on = True
        woke = False
        try:
            c.timed_wait(float(timeout))
            woke = orig(self, timeout)
            return woke
        finally:
            c.timed_over(timer=not woke)
            _IN.on = False

    def wait(self: Any, timeout: float | None = None) -> bool:
        order, me = _waiters(self), threading.get_ident()
        order.append(me)
        try:
            return timed(self, timeout)
        finally:
            if me in order:
                order.remove(me)

    def notify(self: Any, n: int = 1) -> None:
        """A thread woken by another is running from the notify on, not when it gets to tell so
        itself: taken out of the timed waits here, on the notifier's thread, before the notifier
        can block and claim its rank blocked (it would otherwise claim the woken one asleep
        until its timer, and a deadline could fire before the post it is about to make)."""
        if self._is_owned():
            order = _waiters(self)
            woken, order[:n] = order[:n], []
            if woken and (c := client.CLIENT) is not None:
                c.timed_woken(woken)
        orig_notify(self, n)

    threading.Condition.wait = wait  # type: ignore[method-assign]
    threading.Condition.notify = notify  # type: ignore[method-assign]
