"""A fuzz campaign: the budget split into shards, run on some executor, read in shard order.

Reproducibility is the design constraint. The shards (`plan_shards`) depend on the budget,
the seed and the shard size only; each is a pure function of its spec (`search.run_shard`);
and the campaign's answer is read in shard order: every shard up to and including the
first one that found a failure, none after it, the way one hypothesis run stops generating
once it has a bug to shrink. Which executor ran them, how many at once and in what order
they finished changes the time taken, never the answer.

Executors: `InProcess` (``--jobs 1``: shards one after another, here), `LocalPool`
(``--jobs N``: N forked worker processes on this machine) and, for campaigns that outgrow
one machine, `simdist.fuzz.cluster.DaskExecutor`. They share one small protocol
(`Executor`); the campaign loop (`run_campaign`) does the ordering, the early stop and Ctrl-C.
"""

from __future__ import annotations

import contextlib
import hashlib
import math
import multiprocessing as mp
import os
import signal
import threading
import time
from collections.abc import Callable
from concurrent.futures import FIRST_COMPLETED, Future, ProcessPoolExecutor, wait
from dataclasses import dataclass, field
from queue import Empty
from typing import Any, Protocol

from simdist.fuzz.search import ShardResult, ShardSpec, run_shard
from simdist.fuzz.template import Template
from simdist.procs import LAUNCHER_PID_ENV, die_with_parent

SHARD_SIZE = 100  # examples per shard: hypothesis's own default per test, and small enough to spread a budget
ShardFound = Callable[[int, str, dict[str, Any]], None]  # (shard index, failure class, schedule)


def shard_seed(seed: int, index: int) -> int:
    """Shard 0 searches with the campaign's seed itself (a budget of one shard is exactly the
    plain hypothesis run of that seed); the others with seeds derived from (seed, index)."""
    if index == 0:
        return seed
    return int.from_bytes(hashlib.sha256(f"simdist-fuzz/{seed}/{index}".encode()).digest()[:8], "big")


def plan_shards(budget: int, seed: int, shard_size: int = SHARD_SIZE, *, shrink: bool = True, compress: bool = True,
                use_db: bool = False, replay: dict[str, bytes] | None = None) -> list[ShardSpec]:
    """The campaign's shards: ceil(budget / shard_size) of them, the last one taking the rest.
    Only shard 0 replays the saved examples (once is enough, and it is the shard read first)."""
    n = max(1, math.ceil(budget / shard_size))
    budgets = [shard_size] * (n - 1) + [budget - shard_size * (n - 1)]
    return [ShardSpec(index=i, seed=shard_seed(seed, i), budget=b, shrink=shrink, compress=compress, use_db=use_db,
                      replay=replay if i == 0 else None) for i, b in enumerate(budgets)]


class Executor(Protocol):
    """Where shards run. The campaign calls `submit` once, then `results` until it has what it
    needs, `cancel_after` once a shard failed, `interrupt` on Ctrl-C, and `close`."""

    def submit(self, template: Template, specs: list[ShardSpec], on_found: ShardFound | None,
               stop: threading.Event) -> None: ...

    def results(self, timeout: float) -> list[ShardResult]: ...

    def busy(self) -> bool: ...

    @property
    def jobs(self) -> int: ...

    def cancel_after(self, index: int) -> None: ...

    def interrupt(self) -> None: ...

    def close(self) -> None: ...


# ---------------------------------------------------------------------------- in this process
class InProcess:
    """``--jobs 1``: each `results` call runs the next shard here. Ctrl-C is seen between two
    examples (the campaign's stop event), and a failure class is reported the moment it is found."""

    jobs = 1

    def __init__(self, on_example: Callable[[int, str], None] | None = None):
        self.on_example = on_example
        self.stop = threading.Event()
        self.todo: list[ShardSpec] = []
        self.cancel = math.inf
        self.done_examples = 0

    def submit(self, template: Template, specs: list[ShardSpec], on_found: ShardFound | None,
               stop: threading.Event) -> None:
        self.template, self.todo, self.on_found, self.stop = template, list(specs), on_found, stop

    def results(self, timeout: float) -> list[ShardResult]:
        while self.todo and self.todo[0].index > self.cancel:
            self.todo.pop(0)
        if not self.todo:
            return []
        spec = self.todo.pop(0)
        found = None if self.on_found is None else (lambda k, d, i=spec.index: self.on_found(i, k, d))
        tick = None
        if self.on_example is not None:
            base, cb = self.done_examples, self.on_example
            tick = (lambda n, phase: cb(base + n, phase))  # noqa: E731 - counts go on across shards
        r = run_shard(self.template, spec, stop=self.stop.is_set, on_found=found, on_example=tick)
        self.done_examples += r.examples
        return [r]

    def busy(self) -> bool:
        return False  # a shard runs only inside `results`

    def cancel_after(self, index: int) -> None:
        self.cancel = min(self.cancel, index)

    def interrupt(self) -> None:
        self.stop.set()
        self.todo = []

    def close(self) -> None:
        self.todo = []


# ---------------------------------------------------------------------------- local processes
_WORKER: dict[str, Any] = {}  # a pool worker's shared flags and event queue (set by _init_worker)


def _init_worker(parent: int, stop: Any, cancel: Any, campaign: Any, events: Any) -> None:
    """In each pool worker: end with the parent (even a SIGKILLed one), and leave Ctrl-C to
    the parent, which stops the shards through `stop`.

    Like every process simdist starts (`simdist.procs`), a worker leads its own session, so
    a terminal's Ctrl-C reaches the launcher only (SIGINT is ignored too, should it be sent
    to the worker itself). Its own session is also its own scheduling group where the kernel
    groups by session (autogroup): N workers then get N processes' share of a busy machine,
    as N separate runs would, not one share split N ways."""
    os.environ[LAUNCHER_PID_ENV] = str(parent)
    die_with_parent()
    with contextlib.suppress(OSError):  # already a session leader (never, for a forked worker)
        os.setsid()
    signal.signal(signal.SIGINT, signal.SIG_IGN)
    _WORKER.update(stop=stop, cancel=cancel, campaign=campaign, events=events)


def _pool_shard(template: Template, spec: ShardSpec, campaign: int) -> ShardResult:
    """A shard in a pool worker; it stops early on Ctrl-C, when an earlier shard failed, or
    when its campaign is over (a pool serves one campaign per template of a command)."""
    w = _WORKER

    def stop() -> bool:
        return w["stop"].is_set() or spec.index > w["cancel"].value or w["campaign"].value != campaign

    return run_shard(template, spec, stop=stop, on_found=lambda k, d: w["events"].put((campaign, spec.index, k, d)))


class LocalPool:
    """``--jobs N``: N worker processes on this machine, forked (they start in milliseconds and
    inherit the imported simulator) where the platform can, spawned elsewhere. Make it before
    starting threads of your own (a progress bar): forking copies only the calling thread."""

    def __init__(self, jobs: int):
        ctx = mp.get_context("fork" if "fork" in mp.get_all_start_methods() else "spawn")
        self.jobs = jobs
        self._stop, self._cancel, self._events = ctx.Event(), ctx.Value("q", 2**62), ctx.Queue()
        self._campaign = ctx.Value("q", 0)  # which campaign the shards belong to: older ones stop
        self._pool = ProcessPoolExecutor(jobs, mp_context=ctx, initializer=_init_worker,
                                         initargs=(os.getpid(), self._stop, self._cancel, self._campaign, self._events))
        self._futures: dict[Future[ShardResult], int] = {}
        for f in [self._pool.submit(int, 0) for _ in range(jobs)]:  # start the workers now, not under a progress bar
            f.result()

    def submit(self, template: Template, specs: list[ShardSpec], on_found: ShardFound | None,
               stop: threading.Event) -> None:
        with self._campaign.get_lock():
            self._campaign.value += 1
        self._stop.clear()
        self._cancel.value = 2**62
        self.on_found = on_found
        n = self._campaign.value
        self._futures = {self._pool.submit(_pool_shard, template, s, n): s.index for s in specs}

    def _drain(self) -> None:
        while True:
            try:
                campaign, index, key, d = self._events.get_nowait()
            except Empty:
                return
            if self.on_found is not None and campaign == self._campaign.value:
                self.on_found(index, key, d)

    def results(self, timeout: float) -> list[ShardResult]:
        pending = [f for f in self._futures if not f.cancelled()]
        done, _ = wait(pending, timeout=timeout, return_when=FIRST_COMPLETED) if pending else (set(), set())
        self._drain()
        out = []
        for f in done:
            self._futures.pop(f)
            out.append(f.result())
        return out

    def busy(self) -> bool:
        return any(not f.done() for f in self._futures)

    def cancel_after(self, index: int) -> None:
        with self._cancel.get_lock():
            self._cancel.value = min(self._cancel.value, index)
        for f, i in list(self._futures.items()):
            if i > index and f.cancel():
                self._futures.pop(f)

    def interrupt(self) -> None:
        self._stop.set()
        for f in list(self._futures):
            if f.cancel():
                self._futures.pop(f)

    def close(self) -> None:
        self.interrupt()
        self._pool.shutdown(wait=True, cancel_futures=True)


# ---------------------------------------------------------------------------- the loop
@dataclass
class CampaignResult:
    """The shards whose results count, in order, and whether Ctrl-C cut the campaign short."""

    shards: list[ShardResult] = field(default_factory=list)
    interrupted: bool = False


def run_campaign(template: Template, specs: list[ShardSpec], executor: Executor, *,
                 on_found: ShardFound | None = None, on_shard: Callable[[ShardResult], None] | None = None,
                 stop: threading.Event | None = None, poll_s: float = 0.1) -> CampaignResult:
    """Run `specs` on `executor` until every shard up to the first failing one is done.

    Ctrl-C (a KeyboardInterrupt here, or `stop` set by a signal handler) interrupts every
    running shard; the shards that had finished, and what the interrupted ones had found so
    far, come back with `interrupted` set."""
    done: dict[int, ShardResult] = {}
    first_failed: int | None = None
    stop = stop or threading.Event()
    executor.submit(template, specs, on_found, stop)
    try:
        while True:
            needed = range(first_failed + 1 if first_failed is not None else len(specs))
            if all(i in done for i in needed):
                break
            if stop.is_set():
                raise KeyboardInterrupt
            for r in executor.results(poll_s):
                if first_failed is not None and r.index > first_failed:
                    continue  # cancelled, or finished after an earlier shard failed: not part of the answer
                done[r.index] = r
                if on_shard is not None:
                    on_shard(r)
                if r.stopped:  # Ctrl-C reached this shard before the campaign loop
                    raise KeyboardInterrupt
                if r.failed and (first_failed is None or r.index < first_failed):
                    first_failed = r.index
                    executor.cancel_after(r.index)
    except KeyboardInterrupt:
        executor.interrupt()
        for r in _collect(executor):
            done.setdefault(r.index, r)
        limit = first_failed if first_failed is not None else len(specs)
        return CampaignResult([done[i] for i in sorted(done) if i <= limit], interrupted=True)
    return CampaignResult([done[i] for i in range(first_failed + 1 if first_failed is not None else len(specs))])


def _collect(executor: Executor, limit_s: float = 30.0) -> list[ShardResult]:
    """After `interrupt`: what the running shards return (each stops at its next example)."""
    out: list[ShardResult] = []
    deadline = time.monotonic() + limit_s
    while executor.busy() and time.monotonic() < deadline:
        try:
            out += executor.results(0.1)
        except Exception:  # a cancelled or broken shard: nothing to keep
            break
    return out
