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

Once every rank is blocked but for such threads, nothing but a timer can end the stand-still:
the coordinator then ends the first of them at once, as that timer would (`"wake"`, the wait's
number; `simdist.script.timedwakes`), rather than wait it out in wall time, so a tqdm monitor
that wakes every 10 s carries a run to torch's 30-min default timeout in seconds. The woken wait
returns False, as a timed-out one does, with the process's clocks moved on to its end
(`rank.simclock`). The wait is the standard library's `Condition.wait`, written out here so that
its waiter lock is at hand (`_wait`): the coordinator's wake releases it under the condition's
lock (`_wake`), so that a `notify` and the wake never both count for the one wait.
"""

from __future__ import annotations

import itertools
import os
import queue
import sys
import threading
from _thread import allocate_lock
from dataclasses import dataclass
from typing import Any

from simdist.frames import SIMDIST_DIR as _SIMDIST
from simdist.script.rank import client, simclock
from simdist.script.rank.threads import OWN_PREFIX, SITE_DIR, STDLIB_DIR

_IN = threading.local()  # this thread is telling a timed wait already (no wait inside it is told)
_NUMBERS = itertools.count(1)  # each told wait's number: a wake names the wait it ends


@dataclass
class _Told:
    """A told timed wait in progress: what the coordinator's wake needs to end it."""

    cond: Any
    number: int
    ident: int  # its thread's
    ends: float  # its timer's end on the script's clock (`simclock.now`)
    waiter: Any = None  # its lock in the condition's waiters, once it waits
    woken: bool = False  # the coordinator's wake ended it (a timeout, not a notify)
    over: bool = False


_TOLD: dict[int, _Told] = {}  # thread key (`client.thread_key`) -> its told wait in progress
_WAKER: list[Any] = [None, None]  # [the pid whose waker thread runs, its queue of wakes]


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


def _wait(cond: Any, timeout: float, told: _Told) -> bool:
    """`threading.Condition.wait(timeout)` as the standard library writes it (3.8-3.13), with
    the waiter lock kept in `told` (under the condition's lock) for `_wake`; a wait `_wake`
    ended returns False, as one its timer ended."""
    if not cond._is_owned():
        raise RuntimeError("cannot wait on un-acquired lock")
    waiter = allocate_lock()
    waiter.acquire()
    cond._waiters.append(waiter)
    told.waiter = waiter
    saved_state = cond._release_save()
    gotit = False
    try:  # restore state no matter what (e.g., KeyboardInterrupt)
        gotit = waiter.acquire(True, timeout)
    finally:
        cond._acquire_restore(saved_state)
        told.over = True
        gotit = gotit and not told.woken
        if not gotit:
            try:
                cond._waiters.remove(waiter)
            except ValueError:
                pass
    return gotit


def _wake(h: dict[str, Any]) -> None:
    """The coordinator ends thread `tid`'s told wait number `n` as its timer would: under the
    condition's lock (a `notify` holds it too), if that wait still stands, the script's clocks
    move on to its end and its waiter is released (`_wait` reads the release as its timeout)."""
    told = _TOLD.get(int(h["tid"]))
    if told is None or told.number != int(h["n"]):
        return
    with told.cond:
        if told.over or told.waiter is None:
            return
        try:
            told.waiter.release()
        except RuntimeError:  # a notify released it first: a wake by another thread
            return
        told.woken = True
        order = _waiters(told.cond)
        if told.ident in order:
            order.remove(told.ident)  # (`notify` must count the next waiter, not this one)
        simclock.advance_to(told.ends)


def _woken(h: dict[str, Any]) -> None:
    """A "wake" from the coordinator (on the reader thread, which must not block on a script's
    lock: completions come through it): to the waker thread, started in the rank's own process
    (the rank layer is installed in the fork server, whose threads a fork does not copy)."""
    if _WAKER[0] != os.getpid():
        wakes: queue.SimpleQueue[dict[str, Any]] = queue.SimpleQueue()
        _WAKER[:] = [os.getpid(), wakes]
        threading.Thread(target=_serve_wakes, args=(wakes,), name=f"{OWN_PREFIX}waker", daemon=True).start()
    _WAKER[1].put(h)


def _serve_wakes(wakes: queue.SimpleQueue[dict[str, Any]]) -> None:
    while True:
        _wake(wakes.get())


def install() -> None:
    simclock.install()
    orig, orig_notify = threading.Condition.wait, threading.Condition.notify

    def timed(self: Any, timeout: float | None) -> bool:
        c = client.CLIENT
        if (timeout is None or timeout <= 0 or c is None or getattr(_IN, "on", False)
                or threading.current_thread().name.startswith(OWN_PREFIX) or _simdists(sys._getframe(2))):
            return orig(self, timeout)
        _IN.on = True
        key = client.thread_key()
        told = _TOLD[key] = _Told(self, next(_NUMBERS), threading.get_ident(), simclock.now() + float(timeout))
        woke = False
        try:
            c.timed_wait(float(timeout), told.number)
            woke = _wait(self, float(timeout), told)
            return woke
        finally:
            _TOLD.pop(key, None)
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
    client.on_message("wake", _woken)
    client.on_message("clock", lambda h: simclock.advance_to(float(h["p"])))  # a deadline ended a wait (`expiry`)
