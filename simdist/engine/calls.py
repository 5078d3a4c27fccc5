"""One rank's part in an operation as the engine holds it (`Call`), the calls of one
collective (`Instance`), the handle the rank gets back (`Work`) and what the engine knows
of the rank (`RankState`).

Its own module because both the matching core (`core`) and the bridge to the backend's
pairing rules (`gloo_bridge`) read it, and neither should import the other for it.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

import simpy

from simdist.engine.values import Payload
from simdist.report import RankError, TraceEntry

# Where a send or receive waits for its match: (group, src, dst, tag). Each process group
# is a Gloo context of its own with its own pairs, so a send in one group never meets a
# receive posted in another, whatever the ranks and tag (a WORLD send paired with a side
# group's pending `irecv` was a simulator-only p2p size mismatch: tests/test_engine.py).
P2PKey = tuple[str, int, int, int]


@dataclass(slots=True)
class Call:
    """One rank's part in a collective or p2p op.

    Its outcome is held here (`ok`, `value`); the simpy event that a waiting process yields
    is made only when someone asks for it (`event`). Most calls are async ones that have
    completed before their rank waits on them, and an event nobody waits on would still
    cost its allocation and a trip through the event queue: in a DDP + ZeRO loop that is
    three quarters of the engine's events. An event made after the outcome is triggered
    at once with it, so a waiter sees the same thing either way."""

    rank: int
    op: str
    payload: Payload
    reduce_op: str | None
    root: int | None
    entry: TraceEntry
    env: simpy.Environment
    # the issuing rank's: `wait` marks what it waits on there (not part of the call's value)
    state: RankState | None = field(default=None, repr=False, compare=False)
    ok: bool | None = None  # None while pending; True: completed; False: failed
    value: Any = None  # the result Payload, or the exception it failed with
    # left waiting in a stuck collective: the peers whose exit fails it (Gloo: those it has an
    # op pending with, `MismatchVerdict.waits_on`); None: not known, any member's exit does
    waits_on: frozenset[int] | None = None
    _event: simpy.Event | None = None

    @property
    def done(self) -> bool:
        return self.ok is not None

    # The handle the rank gets back is the call itself (torch's `Work`: `yield from work.wait()`):
    # one object less per rank-collective than a separate handle. `work.call` is kept for the
    # callers that read the call through the handle (the script coordinator).
    @property
    def call(self) -> Call:
        return self

    def wait(self) -> Generator[Any, Any, Payload]:
        if self.ok is not None:
            # already completed or failed: evaluate without blocking
            if not self.ok:
                raise self.value
            return self.value  # type: ignore[no-any-return]
        rs = self.state
        assert rs is not None, "a call the engine handed out knows its rank"
        rs.waiting_on = self.entry
        try:
            result = yield self.event
        finally:
            rs.waiting_on = None
        return result  # type: ignore[no-any-return]

    @property
    def event(self) -> simpy.Event:
        """The event of this call's outcome, for a process to yield or a listener to hook."""
        if self._event is None:
            self._event = simpy.Event(self.env)
            if self.ok is not None:
                self._trigger(self._event)
        return self._event

    def settle(self, ok: bool, value: Any) -> None:
        """Record the outcome (the first one wins) and trigger the event if one was made."""
        if self.ok is not None:
            return
        self.ok, self.value = ok, value
        if self._event is not None:
            self._trigger(self._event)

    def complete(self, result: Any, now: float) -> None:
        """Completed at `now` with `result`: its trace entry says so, then `settle`."""
        e = self.entry
        e.t_done = now
        e.completed = True
        self.settle(True, result)

    def _trigger(self, ev: simpy.Event) -> None:
        if self.ok:
            ev.succeed(self.value)
        else:
            ev.fail(self.value)
            ev.defused = True  # a failed call is the rank's news, not the event loop's


@dataclass(slots=True)
class Instance:
    """Sequence number `seq` of one process group: the calls of its members so far."""

    group: str
    seq: int
    members: list[int]
    sig: tuple = ()  # the first call's (op, numel, dtype, root): a later call that differs makes it `mixed`
    reduce_op: str | None = None  # the first call's: a later call of the same `sig` but another sets `reduce_differs`
    calls: dict[int, Call] = field(default_factory=dict)
    matched: bool = False
    finished: bool = False
    # the backend pairs them but never completes them all (a mismatch hang or abort, a member
    # that failed before the wire or exited): the calls left wait on `Call.waits_on`
    stuck: bool = False
    # posted calls differ in what their messages depend on: they may abort one another before
    # the other members post (`GlooExits._settle_gone`)
    mixed: bool = False
    reduce_differs: bool = False

    @property
    def alike(self) -> bool:
        """Every call posted has the same fingerprint (op, numel, dtype, reduce op, root): what
        lets matching and results skip comparing the calls again, rank by rank."""
        return not self.mixed and not self.reduce_differs


Work = Call  # what `Engine.issue` and `Engine.p2p` return: the rank's own call (see `Call.wait`)


def wait_all(works: list[Work]) -> Generator[Any, Any, None]:
    """Wait on each of `works` in order, results dropped (`for w in works: yield from
    w.wait()`): a work that has completed by then, as most async ones have, is passed without
    a `wait` generator of its own (one per rank-collective otherwise)."""
    for w in works:
        if w.ok is not True:
            yield from w.wait()


@dataclass
class RankState:
    rank: int
    alive: bool = True
    waiting_on: TraceEntry | None = None
    trace: list[TraceEntry] = field(default_factory=list)
    process: simpy.Process | None = None
    abort_error: RankError | None = None
    phase: str = "init"
    iteration: int | None = None
