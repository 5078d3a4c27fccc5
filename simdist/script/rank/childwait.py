"""Simulated side: a rank's main thread that waits for a child process it started is late for
its peers by that wait, as on real Gloo.

A training script often has rank 0 run a command before a barrier (a download, a data set's
preprocessing, `git rev-parse` for the log): `subprocess.run`, `check_output`, `Popen.wait` /
`communicate`, `os.system`. The wait uses no CPU of the rank's thread, so the compute the
coordinator measures (`ranks.RankConn.advance`) missed it, and the simulator had rank 0 reach
the barrier at once: where real Gloo's peers timed out waiting (a short group timeout) the
simulated run completed (`tests/scripts/child_wait_timeout.py`). Its wall time is told once
the wait ends, as a sleep of that length that began where the wait began (`"w"`: measured, so
`--zero-compute` leaves it out, keeping its times deterministic); how long a child runs cannot
be known before. Only the main thread: another thread's wait delays no collective of the
main thread's, as its sleeps do not (`RankConn.timed_wait`). Only the outermost of nested
waits (`run` calls `communicate`, which calls `wait`) is counted.
"""

from __future__ import annotations

import functools
import os
import subprocess
import threading
import time
from collections.abc import Callable
from typing import Any

from simdist.script.rank import client, simclock, stack

_inside = threading.local()


def _counted(fn: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(fn)
    def wait(*args: Any, **kwargs: Any) -> Any:
        c = client.CLIENT
        if (c is None or c.rank is None or getattr(_inside, "yes", False)
                or threading.current_thread() is not threading.main_thread()):
            return fn(*args, **kwargs)
        said = {"t": "sleep", "cpu": time.thread_time(), "frames": stack.caller_stack(), "w": 1}
        _inside.yes, began = True, simclock.real_monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            _inside.yes = False
            said["s"] = max(simclock.real_monotonic() - began, 0.0)
            c.send(said)

    return wait


def install() -> None:
    subprocess.Popen.wait = _counted(subprocess.Popen.wait)  # type: ignore[method-assign]
    subprocess.Popen.communicate = _counted(subprocess.Popen.communicate)  # type: ignore[method-assign]
    os.system = _counted(os.system)
