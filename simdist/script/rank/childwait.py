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
waits (`run` calls `communicate`, which calls `wait`) is counted, and only its wall time less
the CPU its thread used meanwhile (which the next message's CPU time counts already).

The same for the rank's other helper processes: a `multiprocessing.Pool`'s results
(`ApplyResult.wait`, under `map`, `apply`, `starmap`; `imap`'s next and `__next__`) and a DataLoader's workers
(the main thread's wait for the next batch, `_MultiProcessingDataLoaderIter._get_data`): a rank
whose workers are slow (an expensive `__getitem__`) is late for every step on real Gloo, where
its peers' short group timeout fires (`tests/scripts/slow_loader_workers.py`).
"""

from __future__ import annotations

import functools
import multiprocessing.pool
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
        cpu = time.thread_time()  # (its start told first: the wait ends its length after it, `RankConn.child_wait`)
        c.send({"t": "sleep", "cpu": cpu, "frames": stack.caller_stack(), "w": 1, "b": 1})
        _inside.yes, began = True, simclock.real_monotonic()
        try:
            return fn(*args, **kwargs)
        finally:
            _inside.yes = False
            c.send({"t": "sleep", "cpu": cpu, "w": 1,
                    "s": max(simclock.real_monotonic() - began - (time.thread_time() - cpu), 0.0)})

    return wait


def install() -> None:
    subprocess.Popen.wait = _counted(subprocess.Popen.wait)  # type: ignore[method-assign]
    subprocess.Popen.communicate = _counted(subprocess.Popen.communicate)  # type: ignore[method-assign]
    os.system = _counted(os.system)
    multiprocessing.pool.ApplyResult.wait = _counted(multiprocessing.pool.ApplyResult.wait)  # type: ignore[method-assign]
    # (`__next__` is the class's alias of `next`, bound at its definition: a for loop over
    # `imap` calls it, and patching `next` alone left that wait uncounted)
    it = multiprocessing.pool.IMapIterator
    it.next = it.__next__ = _counted(it.next)  # type: ignore[method-assign]


def install_loader(_torch: Any) -> None:
    """Once torch is imported: the main thread's wait for a DataLoader worker's batch."""
    from torch.utils.data import dataloader

    it = dataloader._MultiProcessingDataLoaderIter
    it._get_data = _counted(it._get_data)  # type: ignore[method-assign]
