"""Simulated side: the script's clocks read simulated time where the coordinator ran time forward.

When every rank is blocked but for threads in a timed wait (`rank.timedwait`), the coordinator
does not wait out their timers in wall time: it wakes the first of them at once, as its timer
would have (`simdist.script.timedwakes`), and ends a wait at its Gloo deadline without the wall
clock having got there (`simdist.script.expiry`). For the script that time has passed: a
progress bar's monitor reads `time.time()` when it wakes to decide whether to redraw, a
`Queue.get(timeout=)` computes what is left of its timeout from `time.monotonic()`, and a rank
whose all_reduce timed out after 30 min prints how long it waited. So the process's clocks
carry an offset, the simulated time skipped so far (`advance_to`), which only grows:
`time.time`, `time.monotonic`, `time.perf_counter` and their `_ns` forms read the real clock
plus it (the standard library's own names for `monotonic`, `threading._time` and `queue.time`,
bound before this ran, too). simdist's own code reads the real clocks: its wall times go to the
coordinator (a block's start, the Flight Recorder's generation starts), which keeps wall time.

The calendar clocks C reads where no time is given (`datetime.now()`, `time.localtime()`,
`time.strftime` with no time tuple: a log line's timestamp) read it too (`_calendar`). Not
moved: C++ code's own clocks, and CPU-time clocks (`time.thread_time`, `process_time`: a
skipped wait uses no CPU either). Another process of the rank's (a DataLoader worker) keeps
its own clock.
"""

from __future__ import annotations

import copyreg
import ctypes
import datetime
import gc
import queue
import sys
import threading
import time
from typing import Any

from simdist.frames import SIMDIST_DIR
from simdist.script.rank import alarms

_offset = 0.0  # seconds of simulated time skipped so far in this process
_lock = threading.Lock()
_REAL = {name: getattr(time, name) for name in ("time", "monotonic", "perf_counter")}
real_monotonic = _REAL["monotonic"]


def offset() -> float:
    return _offset


def now() -> float:
    """The script's monotonic clock: the real one plus the simulated time skipped."""
    return real_monotonic() + _offset


def advance_to(target: float) -> None:
    """The script's monotonic clock reads at least `target` from now on (a wait the coordinator
    ended at its simulated end, `now()`'s basis); never back."""
    global _offset
    with _lock:
        new = max(_offset, target - real_monotonic())
        skipped, _offset = new - _offset, new
    alarms.shift(skipped)  # a `signal.alarm` runs on the script's clock too


def unbound(name: str, fn: Any) -> Any:
    """`fn` as a replacement for `time.<name>` that, like the builtin, binds no instance
    (logging's `Formatter.converter = time.localtime`, a class body's `clock = time.perf_counter`:
    called through an instance, a function gets the instance as its first argument): a
    staticmethod, callable since Python 3.10, pickled as `time.<name>` (`_reduce_static`). Its
    call adds no Python frame: `sys._getframe(1)` in `fn` is its caller's. (Both sides: boot's
    `time.sleep` is one, and `ProcessPoolExecutor.map(time.sleep, ...)` pickles it.)"""
    copyreg.pickle(staticmethod, _reduce_static)
    fn.__module__, fn.__name__, fn.__qualname__ = "time", name, name
    return staticmethod(fn)


def _reduce_static(obj: Any) -> str:
    """Pickles (and copies) a replacement of `unbound` by its name in `time`; any other
    staticmethod cannot be pickled, as without this."""
    if getattr(time, getattr(obj, "__name__", ""), None) is obj:
        return str(obj.__name__)
    raise TypeError("cannot pickle 'staticmethod' object")


def _shifted(name: str) -> tuple[object, object]:
    real, real_ns = _REAL[name], getattr(time, f"{name}_ns")

    def clock() -> float:
        if _offset and not sys._getframe(1).f_code.co_filename.startswith(SIMDIST_DIR):
            return real() + _offset
        return real()

    def clock_ns() -> int:
        if _offset and not sys._getframe(1).f_code.co_filename.startswith(SIMDIST_DIR):
            return real_ns() + int(_offset * 1e9)
        return real_ns()

    return unbound(name, clock), unbound(f"{name}_ns", clock_ns)


def _script_now(caller: Any) -> float | None:
    """time.time() as the script reads it from frame `caller`, where a skip moved it; None: as
    the real clock reads (nothing skipped yet, or simdist's own code)."""
    if _offset and not caller.f_code.co_filename.startswith(SIMDIST_DIR):
        return _REAL["time"]() + _offset
    return None


def _calendar() -> None:
    """The calendar clocks that C reads with no time given: `time.localtime()`, `gmtime()`,
    `ctime()`, `asctime()`, `strftime(fmt)` (a log line's timestamp), and `datetime.now(tz)`,
    `datetime.utcnow()` (`date.today()` and `datetime.today()` call `time.time` themselves):
    each reads the script's time.time. datetime's type is immutable and its instances come
    from C code everywhere (pickles, `isinstance`, singledispatch and YAML representers keyed
    by the class), so the class stays, and only its `now` and `utcnow` are swapped in its dict."""
    real = {name: getattr(time, name) for name in ("localtime", "gmtime", "ctime", "asctime", "strftime")}

    def at(name: str) -> Any:
        return lambda secs=None: real[name](_script_now(sys._getframe(1)) if secs is None else secs)

    def asctime(t: Any = None) -> str:
        return real["asctime"](real["localtime"](_script_now(sys._getframe(1))) if t is None else t)

    def strftime(format: str, t: Any = None) -> str:  # noqa: A002 - the standard library's name
        return real["strftime"](format, real["localtime"](_script_now(sys._getframe(1))) if t is None else t)

    for name, fn in (*((n, at(n)) for n in ("localtime", "gmtime", "ctime")), ("asctime", asctime), ("strftime", strftime)):
        setattr(time, name, unbound(name, fn))
    try:
        slots = gc.get_referents(datetime.datetime.__dict__)[0]
        real_now, real_utcnow = slots["now"], slots["utcnow"]  # (descriptors: `cls` is the caller's, a subclass too)
    except (IndexError, TypeError, KeyError):  # not CPython: datetime.now reads the real clock
        return

    def now(cls: Any, tz: Any = None) -> Any:
        t = _script_now(sys._getframe(1))
        return real_now.__get__(None, cls)(tz) if t is None else cls.fromtimestamp(t, tz)

    def utcnow(cls: Any) -> Any:
        t = _script_now(sys._getframe(1))
        return real_utcnow.__get__(None, cls)() if t is None else (
            cls.fromtimestamp(t, datetime.timezone.utc).replace(tzinfo=None))

    slots["now"], slots["utcnow"] = classmethod(now), classmethod(utcnow)
    ctypes.pythonapi.PyType_Modified(ctypes.py_object(datetime.datetime))


def install() -> None:
    """Once per process, before torch is imported (`boot.install`: torch imports tqdm, whose
    `from time import time` would keep the real clock; `timedwait.install` makes sure)."""
    if time.monotonic is not _REAL["monotonic"]:  # (installed already)
        return
    for name in _REAL:
        clock, clock_ns = _shifted(name)
        setattr(time, name, clock)
        setattr(time, f"{name}_ns", clock_ns)
    threading._time = time.monotonic  # type: ignore[attr-defined]  # Condition.wait_for, Semaphore, Barrier
    queue.time = time.monotonic  # type: ignore[attr-defined]  # Queue.get/put(timeout=)
    _calendar()
