"""Which of a rank's Python threads could still post an operation: one definition for both sides.

A rank is blocked only when none of its script's threads can still post: a thread that runs,
sleeps, or waits with a timeout (an async checkpoint's or a heartbeat's thread, a
`threading.Timer`, tqdm's monitor) uses no CPU while it sleeps, yet may post the operation its
peers wait for when it wakes. A thread counts as not running when it waits in the backend
(what that means is the caller's: on real Gloo a futex wait in torch's code, `rank.stall`; in
the simulator a simdist wait, `rank.client`), or when it is the standard library's plumbing
asleep until another thread of the process wakes it (`idle_plumbing`: the feeder thread of a
DataLoader's `multiprocessing` queue). simdist's own threads (named `simdist-...`) are not the
script's, unless the caller names them (a callback runner running the script's callback).

Standard library only: this runs in the user's processes, on the simulated and the real side.
"""

from __future__ import annotations

import os
import platform
import sys
import sysconfig
import threading
from collections.abc import Callable, Collection, Iterator
from typing import Any

# the futex syscall's number (asm/unistd.h); elsewhere no thread counts as idle plumbing
FUTEX_NR = {"x86_64": 202, "aarch64": 98}.get(platform.machine())
# nanosleep and clock_nanosleep (std::this_thread::sleep_for): a wait that a timer ends
SLEEP_NRS = {"x86_64": (35, 230), "aarch64": (101, 115)}.get(platform.machine(), ())
STDLIB_DIR = os.path.join(os.path.abspath(sysconfig.get_paths()["stdlib"]), "")
SITE_DIR = os.path.join(STDLIB_DIR, "site-packages", "")
# simdist's rank layer: its wrappers around the standard library (`devices` wraps every thread's
# bootstrap) are not the script's code
_RANK_LAYER = os.path.join(os.path.dirname(os.path.abspath(__file__)), "")
OWN_PREFIX = "simdist-"  # simdist's own threads' names

# (ident, kernel thread id, innermost frame) -> whether that thread waits in the backend
InBackendWait = Callable[[int, int, Any], bool]


def syscall_args(tid: int) -> list[str] | None:
    """The thread's syscall number and arguments as the kernel shows them (None: no /proc)."""
    try:
        with open(f"/proc/self/task/{tid}/syscall", encoding="ascii") as f:
            return f.read().split()
    except OSError:
        return None


def syscall(tid: int) -> int | None:
    fields = syscall_args(tid)
    if fields is None:
        return None
    return int(fields[0]) if fields and fields[0].lstrip("-").isdigit() else -1  # "running": not in a syscall


def voluntary_switches(tid: int) -> int | None:
    """How often the thread has given up the CPU (it slept or waited), per the kernel; None: no /proc."""
    try:
        with open(f"/proc/self/task/{tid}/status", encoding="ascii") as f:
            return next((int(line.split()[1]) for line in f if line.startswith("voluntary_ctxt_switches:")), None)
    except (OSError, ValueError, IndexError):
        return None


def untimed_private_futex(tid: int) -> bool:
    """futex(uaddr, op, val, timeout, ...) with FUTEX_PRIVATE_FLAG and no timeout: a wait
    that only another thread of this process can end (a `threading` lock or condition
    without a timeout; a multiprocessing semaphore is shared with other processes)."""
    fields = syscall_args(tid)
    try:
        return (fields is not None and len(fields) > 4 and int(fields[0]) == FUTEX_NR
                and int(fields[2], 16) & 128 != 0 and int(fields[4], 16) == 0)
    except ValueError:
        return False


def _stdlib_frame(frame: Any) -> bool:
    filename = os.path.abspath(frame.f_code.co_filename)
    return (frame.f_code.co_filename.startswith("<frozen ") or filename.startswith(_RANK_LAYER)
            or (filename.startswith(STDLIB_DIR) and not filename.startswith(SITE_DIR)))


def stdlib_only(frame: Any) -> bool:
    """Every frame of the stack is the standard library's (no site-packages, no script; simdist's
    rank layer wraps some of it): plumbing such as the feeder thread of a DataLoader's
    `multiprocessing` queue."""
    while frame is not None:
        if not _stdlib_frame(frame):
            return False
        frame = frame.f_back
    return True


# torch's DataLoader pin-memory thread (`pin_memory=True` where an accelerator is, as on the
# simulated GPUs): it moves batches from the workers' queue to the main thread's and posts
# nothing, but waits for them with a timeout (it checks for shutdown), so no futex rule says so
_PIN_LOOP = ("_pin_memory_loop", os.path.join("torch", "utils", "data", "_utils", "pin_memory.py"))


def pin_memory_waiting(frame: Any) -> bool:
    """A DataLoader's pin-memory thread waiting for a batch in the standard library's queue."""
    if frame is None or not _stdlib_frame(frame):
        return False
    while frame is not None:
        if frame.f_code.co_name == _PIN_LOOP[0] and frame.f_code.co_filename.endswith(_PIN_LOOP[1]):
            return True
        frame = frame.f_back
    return False


def idle_plumbing(frame: Any, tid: int) -> bool:
    """The standard library's plumbing asleep until another thread of the process wakes it,
    or a DataLoader's pin-memory thread waiting for a batch (`pin_memory_waiting`)."""
    return (stdlib_only(frame) and untimed_private_futex(tid)) or pin_memory_waiting(frame)


def running(in_backend_wait: InBackendWait, skip: Collection[int] = (), own: Collection[int] = ()) -> Iterator[int]:
    """The idents of the script's threads (those in `skip` aside; simdist's own aside, but
    those in `own`) that could still post: neither waiting in the backend nor idle plumbing.
    A thread that runs Python without a `threading` object (a C++ thread calling back into
    Python) runs."""
    threads = {t.ident: t for t in threading.enumerate()}
    for ident, frame in sys._current_frames().items():
        t = threads.get(ident)
        if ident in skip or (t is not None and t.name.startswith(OWN_PREFIX) and ident not in own):
            continue
        tid = None if t is None else t.native_id
        if tid is None or not (in_backend_wait(ident, tid, frame) or idle_plumbing(frame, tid)):
            yield ident
