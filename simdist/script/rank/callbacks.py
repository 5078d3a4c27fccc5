"""Where a simulated op's future runs its callbacks: a runner thread, not the reader thread.

On real Gloo an op's future completes on the worker thread that ran the op, and its `then`
callbacks run there; a callback may issue another collective and wait on it (PowerSGD's
`compute_qs` does `all_reduce(...).get_future().wait()`), which Gloo's other worker thread
runs meanwhile. The client's reader thread must never run such a callback: blocked in it, it
could not read the reply that would unblock it. So completions go, in the order the
coordinator sent them, to one *active* runner thread; a runner that issues an operation or
waits on one from inside a callback gives up being active (it may block on it), and the next
completion goes to a fresh runner; so does the queue when a callback has run HANDOFF_S with
completions waiting (it may wait on a future it got before it started, without parking).

What is ordered: callbacks that neither issue nor wait on an op, nor run long, run one at a
time in completion order on one thread, and an op a callback issues is sent before later
completions go to another runner. What is not: once a callback parks or is handed off, it
runs concurrently with later callbacks, and the order of ops they issue depends on thread
timing, as it does on real Gloo (its two worker threads race the same way).
"""

from __future__ import annotations

import collections
import threading
import time
import traceback
from collections.abc import Callable

HANDOFF_S = 0.05
"""How long the active runner may stay in one job while completions queue behind it before a
fresh runner takes them: a callback may block on a future it got before it started (no
`park()` then), whose completion is queued behind it; Gloo's other worker thread would run it."""


class Runners:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._active: threading.Thread | None = None
        self._busy_since: float | None = None  # when the active runner began its current job
        self._watching = False
        self._in_job: set[int] = set()  # idents of runners running a job (the script's callbacks may post)

    def pending(self) -> tuple[frozenset[int], bool]:
        """The runners running a job now, and whether jobs wait in the queue: for a rank's
        count of threads that could still post (`client.Client.claim`), a job is the script's
        code (a callback may issue an operation), queued or running."""
        with self._lock:
            return frozenset(self._in_job), bool(self._queue)

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` (complete a future, running its callbacks) after the ones submitted before."""
        with self._lock:
            self._queue.append(job)
            if self._active is None:
                self._start()
            self._ensure_watch()
            self._lock.notify_all()

    def park(self) -> None:
        """The calling runner may block next (it issued or waits on an operation inside a
        callback): later completions go to another runner. Nothing on other threads."""
        with self._lock:
            if threading.current_thread() is self._active:
                self._hand_off()

    def _hand_off(self) -> None:
        """Under the lock: the active runner stops serving the queue (it finishes its job)."""
        self._active = None
        self._busy_since = None
        if self._queue:
            self._start()
        self._lock.notify_all()

    def _ensure_watch(self) -> None:
        """Under the lock: watch the active job while completions queue behind it."""
        if self._queue and self._busy_since is not None and not self._watching:
            self._watching = True
            threading.Thread(target=self._watch, name="simdist-callbacks-watch", daemon=True).start()

    def _watch(self) -> None:
        """While completions wait behind a job, hand the queue off once that job has run
        HANDOFF_S: the job may be waiting (without `park()`) on one of them."""
        with self._lock:
            while self._queue and self._busy_since is not None:
                left = self._busy_since + HANDOFF_S - time.monotonic()
                if left <= 0:
                    self._hand_off()
                else:
                    self._lock.wait(left)
            self._watching = False

    def _start(self) -> None:
        t = threading.Thread(target=self._run, name="simdist-callbacks", daemon=True)
        self._active = t
        t.start()

    def _run(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lock:
                while self._active is me and not self._queue:
                    self._lock.wait()
                if self._active is not me:  # parked: another runner serves the queue
                    return
                job = self._queue.popleft()
                self._in_job.add(me.ident or 0)
                self._busy_since = time.monotonic()
                self._ensure_watch()
            try:
                job()
            except Exception:  # a job's error must not stop the queue behind it
                traceback.print_exc()
            finally:
                with self._lock:
                    self._in_job.discard(me.ident or 0)
                    if self._active is me:
                        self._busy_since = None


RUNNERS = Runners()


def forget_after_fork() -> None:
    """In a forked child: the parent's runner threads do not exist here (a queued job or an
    "active" runner that never runs would stall every completion)."""
    global RUNNERS
    RUNNERS = Runners()
