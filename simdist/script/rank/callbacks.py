"""Where a simulated op's future runs its callbacks: a runner thread, not the reader thread.

On real Gloo an op's future completes on the worker thread that ran the op, and its `then`
callbacks run there; a callback may issue another collective and wait on it (PowerSGD's
`compute_qs` does `all_reduce(...).get_future().wait()`), which Gloo's other worker thread
runs meanwhile. The client's reader thread must never run such a callback: blocked in it, it
could not read the reply that would unblock it. So completions go, in the order the
coordinator sent them, to one *active* runner thread; a runner that issues an operation or
waits on one from inside a callback gives up being active (it may block on it), and the next
completion goes to a fresh runner. Callbacks that do not communicate still run one at a time
in completion order, so a run's order of operations does not depend on thread timing.
"""

from __future__ import annotations

import collections
import threading
from collections.abc import Callable


class Runners:
    def __init__(self) -> None:
        self._lock = threading.Condition()
        self._queue: collections.deque[Callable[[], None]] = collections.deque()
        self._active: threading.Thread | None = None

    def submit(self, job: Callable[[], None]) -> None:
        """Run `job` (complete a future, running its callbacks) after the ones submitted before."""
        with self._lock:
            self._queue.append(job)
            if self._active is None:
                self._start()
            self._lock.notify_all()

    def park(self) -> None:
        """The calling runner may block next (it issued or waits on an operation inside a
        callback): later completions go to another runner. Nothing on other threads."""
        me = threading.current_thread()
        with self._lock:
            if me is self._active:
                self._active = None
                if self._queue:
                    self._start()

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
            job()


RUNNERS = Runners()
