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
from the kernel (`rank.stall`). `time.sleep` is told too (`sleep`: a heartbeat's loop; the main
thread's where its process has no child). Other timed waits (a `Lock.acquire(timeout=)`,
`select`, a socket's timeout) are not seen: their threads count as running.

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

from simdist import procs
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
    sleep: bool = False  # a `time.sleep` (`_sleep`): it ends when the script's clock gets to `ends`


_TOLD: dict[int, _Told] = {}  # thread key (`client.thread_key`) -> its told wait in progress
_WAKER: list[Any] = [None, None]  # [the pid whose waker thread runs, its queue of wakes]
_INSTALLED = [False]  # `install` ran (the simulated side): `sleep` tells side threads' sleeps


def _simdists(frame: Any) -> bool:
    """The wait is simdist's own (the rank layer's `Work.wait` polls its events every 20 ms on
    the script's thread): the first caller outside the standard library is simdist's code. A
    thread's start (`Thread._bootstrap_inner`, which the rank layer wraps, `devices`) ends the
    look: a `threading.Timer`'s wait, the standard library's all the way, is the script's."""
    while frame is not None and frame.f_code.co_name != "_bootstrap_inner":
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
        if told.sleep:  # (no notify can end a sleep: its gate may be released already by a clock move)
            told.woken = True
            simclock.advance_to(told.ends)
            _release(told.waiter)
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


def _release(gate: Any) -> None:
    try:
        gate.release()
    except RuntimeError:  # released already, not yet taken back by its sleeper: it looks again anyway
        pass


def _sleep(told: _Told) -> bool:
    """A told `time.sleep`: until the script's clock (`simclock.now`) reads the sleep's end. The
    coordinator's wake moves the clock there (`_wake`); a skip of simulated time while it sleeps
    (a deadline every other rank waited for fired at once, `scriptclocks`) moves its end nearer
    in wall time (`_clock_moved`): a sleep of 4 s in which 2 s were skipped lasts 2 s more, as the
    script's clocks then read 4 s, where one that slept its 4 s of wall time read 6.
    Returns False, as a timed-out `Condition.wait` (no notify ends a sleep)."""
    gate = allocate_lock()
    gate.acquire()
    with told.cond:
        told.waiter = gate
    try:
        while not told.woken and (left := told.ends - simclock.now()) > 0:
            gate.acquire(True, left)
    finally:
        with told.cond:
            told.over = True
    return False


def _clock_moved(h: dict[str, Any]) -> None:
    """The coordinator skipped simulated time ("clock": a deadline ended a wait at once while
    every rank stood still, `expiry`): the script's clocks move on, and each told sleep looks
    again at what is left of it (`_sleep`)."""
    simclock.advance_to(float(h["p"]))
    for told in list(_TOLD.values()):
        if told.sleep:
            with told.cond:
                if not told.over and told.waiter is not None:
                    _release(told.waiter)


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


def _told_wait(cond: Any, timeout: float, tell: Any = None, sleep: bool = False) -> bool:
    """`cond.wait(timeout)` told to the coordinator (`tell(timeout, number)`, by default
    `Client.timed_wait`), for the coordinator's wake to end (`_wake`); the caller has checked
    `tells` and holds `cond`'s lock (a `sleep`'s private condition it need not: `_sleep` takes it
    where it must)."""
    c = client.CLIENT
    assert c is not None
    tell = tell or c.timed_wait
    _IN.on = True
    key = client.thread_key()
    told = _TOLD[key] = _Told(cond, next(_NUMBERS), threading.get_ident(), simclock.now() + timeout, sleep=sleep)
    woke = False
    try:
        tell(timeout, told.number)
        woke = _sleep(told) if sleep else _wait(cond, timeout, told)
        return woke
    finally:
        _TOLD.pop(key, None)
        c.timed_over(timer=not woke)
        _IN.on = False


def tells(timeout: float | None, caller: Any) -> bool:
    """A wait of `timeout` s called from frame `caller` is the script's, to tell: installed
    (the simulated side), a timer, on a thread of the script's, not inside another told wait,
    not simdist's own (`_simdists`)."""
    return (_INSTALLED[0] and timeout is not None and timeout > 0 and client.CLIENT is not None
            and not getattr(_IN, "on", False) and not threading.current_thread().name.startswith(OWN_PREFIX)
            and not _simdists(caller))


def sleep(seconds: float, caller: Any, main: dict[str, Any] | None = None) -> bool:
    """`time.sleep(seconds)` called from frame `caller` (`boot`), as a told timed wait: a
    heartbeat's or monitor's `while True: time.sleep(k)` loop posts nothing before its timer
    ends, as tqdm's `Event.wait(10)` posts nothing (a private condition nothing notifies, so
    only the timer or the coordinator's wake ends it, which moves the script's clocks on to its
    end). `main`: the main thread's "sleep" message (simulated time passes on the rank's clock
    as the sleep says, `RankConn.sleep`), sent as the telling; told only while the process has
    no child (`procs.has_children`): a main thread that sleeps in a loop may be polling a subprocess or
    a worker, whose progress only the wall clock makes. False: not such a sleep (the caller
    sleeps as it would)."""
    if not tells(seconds, caller) or (main is not None and procs.has_children()):
        return False
    c = client.CLIENT
    assert c is not None
    _told_wait(threading.Condition(threading.Lock()), float(seconds),
               (lambda s, number: c.timed_wait(s, number, sleep=True)) if main is None else
               (lambda _s, number: c.send({**main, "n": number}, claim=True, timed=True)), sleep=True)
    return True


def install() -> None:
    simclock.install()
    orig, orig_notify = threading.Condition.wait, threading.Condition.notify
    _INSTALLED[0] = True

    def timed(self: Any, timeout: float | None) -> bool:
        if not tells(timeout, sys._getframe(2)):
            return orig(self, timeout)
        return _told_wait(self, float(timeout))  # type: ignore[arg-type]

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
    client.on_message("clock", _clock_moved)  # a deadline ended a wait (`expiry`)
