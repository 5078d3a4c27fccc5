"""torch `Work` objects for simulated operations: completion, visible waits, futures.

A `SimWork` is one engine operation; it completes on the client's reader thread when the
coordinator answers, after copying the result bytes into the output tensors. `SimWorks`
is one torch call that the backend runs as several operations (Gloo's list
reduce_scatter is one all_reduce per input chunk).
"""

from __future__ import annotations

import functools
import threading
import time
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future, collect_all

from simdist.script.rank import callbacks, client, stack


class SimWork(dist._Work):
    """torch's `Work` for a simulated op: `wait()` is a visible wait (the coordinator knows
    this rank now blocks on it); `get_future()` is what DDP's reducer waits on in C++."""

    def __init__(self, outputs: Sequence[torch.Tensor], result: Any, after: Callable[[], None] | None = None):
        super().__init__()
        self.id = 0
        self._outputs = list(outputs)
        self._after = after  # run once the outputs hold the result (copy a staged result out)
        self.at_wait: Callable[[], None] | None = None  # run by each successful wait() (Gloo's LambdaWork)
        self.source: int | None = None
        self.group_ranks: list[int] = []  # a receive's group (global ranks), for `_source_rank`
        self._result = result
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._error: str | None = None
        self._future: Future | None = None  # what callers get: `_base.then(self._deliver)`
        self._base: Future | None = None
        self.announced = False  # issued with asyncOp=False: the op message said its caller waits at once
        self.futureless = False  # the backend's work for this op has no future (Gloo: p2p, reduce_scatter)
        self.wait_limit_s: float | None = None  # the next wait()'s own timeout (`monitored_barrier`'s rank 0)
        self.completed_view = "op"  # is_completed(): "op" the op's state, "at_wait" once waited, "never"
        self._waited = False
        self._gave_up = threading.Event()  # the coordinator ended a wait(timeout=) before the op completed
        self._gave_up_error = ""

    def complete(self, data: bytearray | None, error: str | None, source: int | None = None) -> None:
        """Called on the reader thread when the coordinator answers (`source`: a receive's
        sender, as a global rank). A failed op may still bring the bytes its backend wrote
        before it raised (Gloo's integer AVG): they land in the outputs, but `after` (copying
        a staged result out) does not run, as the backend's own copy-out never did."""
        self.source = source
        if data is not None:
            _fill(self._outputs, data)
            if error is None and self._after is not None:
                self._after()
        with self._lock:
            self._error = error
            base = self._base
            if base is None:
                self._done.set()
        if base is not None:  # Gloo completes the future (its callbacks run) before the work
            callbacks.RUNNERS.submit(functools.partial(self._settle, base))

    def _settle(self, base: Future) -> None:
        try:
            base.set_result(None)
        finally:
            self._done.set()

    def wait(self, timeout: Any = None) -> bool:
        """Block until the op completes. `timeout` (a timedelta; 0, torch's default, is none):
        the work's own limit on this wait, in simulated time; when it runs out first the wait
        raises torch's "Operation timed out!" and the op goes on (measured on Gloo)."""
        c = client.CLIENT
        limit = timeout.total_seconds() if timeout is not None and hasattr(timeout, "total_seconds") else 0.0
        if c is None:
            self._done.wait()
        else:
            on_main = threading.current_thread() is threading.main_thread()
            if on_main:
                c.main_waits += 1
            callbacks.RUNNERS.park()  # a callback waiting: later completions must not wait for it
            registered = None  # this thread can no longer post, until the op completes
            try:
                if self.announced:  # registered as its op message went (`pg`)
                    self.announced = False
                    registered = c.waiting([self.id])
                elif self._done.is_set():
                    # still told: the rank's simulated clock waits for the op whether or not
                    # its result happened to arrive first (reports must not depend on that race)
                    registered = c.waiting([self.id])
                    c.send({"t": "wait", "id": self.id, "cpu": time.thread_time(), "to": self.wait_limit_s})
                else:  # registered with the message that says how long it waits (`Client.send`)
                    registered = c.send({"t": "wait", "id": self.id, "cpu": time.thread_time(),
                                         "frames": stack.caller_stack(), "to": self.wait_limit_s,
                                         "wt": limit if limit > 0 else None}, claim=True, register=[self.id])
                while not self._done.wait(None if limit <= 0 else 0.02) and not self._gave_up.is_set():
                    pass
                if self._gave_up.is_set():  # before the op's own end, if both came (they come in order)
                    self._gave_up.clear()
                    raise RuntimeError(self._gave_up_error)
            finally:
                c.wait_over(registered)
                if on_main:
                    c.main_waits -= 1
        if self._error is not None:
            raise RuntimeError(self._error)
        if self.at_wait is not None:
            self.at_wait()
        self._waited = True
        return True

    def give_up(self, error: str) -> None:
        """Called on the reader thread: this wait's own timeout ran out (`wait(timeout=)`)."""
        self._gave_up_error = error
        self._gave_up.set()

    def get_future(self) -> Future:
        """The op's future, completed (with its result tensors, or with an error that C++
        waiters see too) when the coordinator answers."""
        if self.futureless:
            raise RuntimeError(NO_FUTURE)
        with self._lock:
            if self._future is not None:
                return self._future
            self._base = base = Future()
            self._future = fut = base.then(self._deliver)
            done = self._done.is_set()
        c = client.CLIENT
        if c is not None:
            c.send({"t": "fut", "id": self.id})  # a future is waited on (by C++ or Python)
        if done:
            base.set_result(None)
        else:
            callbacks.RUNNERS.park()  # a callback may wait on this future next
            if c is not None:
                c.future_requested(self.id)
        return fut

    def _deliver(self, _base: Future) -> Any:
        """The future's value; raising here is how a Python-made future fails for C++ too:
        `then` marks its child future with a real error (`Future.set_exception` from Python
        would only store the exception as the value, which DDP's reducer reads as a bucket)."""
        if self._error is not None:
            raise RuntimeError(self._error)
        return self._result

    @property
    def op_done(self) -> bool:
        """Whether the operation ended (whatever `is_completed()` says of it)."""
        return self._done.is_set()

    def is_completed(self) -> bool:
        if self.completed_view != "op":
            return self._waited and self.completed_view == "at_wait"
        return self._done.is_set()

    def _source_rank(self) -> int:
        """The group rank a receive got its message from (what `dist.recv` without `src` returns)."""
        if self.source is None:
            raise RuntimeError("simdist: the source rank is known once a receive completes")
        return self.group_ranks.index(self.source) if self.group_ranks else self.source

    source_rank = _source_rank

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Any:
        return RuntimeError(self._error) if self._error is not None else None

    def result(self) -> Any:
        if not self._done.is_set():
            raise RuntimeError(NOT_COMPLETED)
        return _work_result(self._result)


# ProcessGroupGloo's words (torch 2.13): a Work without a future (c10d's base Work), and
# AsyncWork::result() before the work completed or for a list of lists
NO_FUTURE = "Work::getFuture not implemented."
NOT_COMPLETED = "Work needs to be completed before calling result(). Should call wait() before result()."


def _work_result(value: Any) -> Any:
    if isinstance(value, list) and any(isinstance(v, list) for v in value):
        raise RuntimeError("work result does not support list of lists, use .getFuture() and value()")
    return value


def _fill(outputs: list[torch.Tensor], data: bytearray) -> None:
    """Copy the result bytes, in order, into the output tensors. Written through `.data`,
    like a backend writing memory: the tensors' autograd version counters stay as they are.
    Fewer bytes than the outputs hold (a receive longer than the message that came) fill
    the front and leave the rest as it was, as Gloo writes only the bytes it got."""
    off = 0
    with torch.no_grad():
        for t in outputs:
            n = min(t.numel(), max(0, (len(data) - off) // t.element_size()))
            if n:
                src = torch.frombuffer(data, dtype=t.dtype, count=n, offset=off)
                if n == t.numel():
                    t.data.copy_(src.view(t.shape))
                else:
                    t.data.view(-1)[:n].copy_(src)
            off += t.numel() * t.element_size()


class SimWorks(dist._Work):
    """One torch call run as several simulated operations, in order: waits for each in
    turn (each wait visible to the coordinator), and its future fails if any part fails."""

    def __init__(self, parts: list[SimWork], result: Any):
        super().__init__()
        self.parts = parts
        self._result = result
        self._future: Future | None = None

    def wait(self, timeout: Any = None) -> bool:
        for w in self.parts:
            w.wait(timeout)
        return True

    def get_future(self) -> Future:
        if any(w.futureless for w in self.parts):
            raise RuntimeError(NO_FUTURE)
        if self._future is None:
            self._future = collect_all([w.get_future() for w in self.parts]).then(self._deliver)
        return self._future

    def _deliver(self, done: Future) -> Any:
        for f in done.value():
            f.value()  # raises the first part's error
        return self._result

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self.parts)

    def is_success(self) -> bool:
        return all(w.is_success() for w in self.parts)

    def exception(self) -> Any:
        return next((e for w in self.parts if (e := w.exception()) is not None), None)

    def result(self) -> Any:
        if not all(w.op_done for w in self.parts):
            raise RuntimeError(NOT_COMPLETED)
        return _work_result(self._result)


# DDP's reducer, per reducer (by id: a pybind object takes no attributes): the Python work
# it was last handed, which C++ alone would not keep alive
_HANDED: dict[int, Any] = {}


def keep_reducer_works() -> None:
    """Keep alive the work DDP hands its reducer under Join (`_set_forward_pass_work_handle`:
    the all-reduce counting the ranks not yet joined, waited on and read through `getFuture`
    in the backward when `divide_by_initial_world_size=False`). A work a Python group
    returned to Python reaches C++ without the holder torch wraps around the works C++
    itself asks a Python group for (`PyWorkHolder`), so once DDP's `_pre_forward` dropped it
    the reducer's calls found no Python override: its `wait()` was c10d's base one and
    `getFuture` raised "Work::getFuture not implemented.", where Gloo's C++ work just works.
    One work a reducer, replaced by the next forward's."""
    from torch._C._distributed_c10d import Reducer

    orig = Reducer._set_forward_pass_work_handle
    if getattr(orig, "_simdist", False):
        return

    @functools.wraps(orig)
    def handed(self: Any, work: Any, use_static_world_size: bool) -> None:
        _HANDED[id(self)] = work
        orig(self, work, use_static_world_size)

    handed._simdist = True  # type: ignore[attr-defined]
    Reducer._set_forward_pass_work_handle = handed
