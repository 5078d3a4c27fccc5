"""The coordinator's deadlines: which wait ends next, whatever its kind, and Gloo's timeouts.

`simdist.script.deadlines` says what a deadline is and which fire next; this mixin applies
that to a running `simdist.script.coordinator.Coordinator`. When nothing can progress it ends
the wait due first in simulated time, of every kind the coordinator knows (`_expire_next`:
Gloo's operations and `Work.wait(timeout=)`s here, a rank's init in `rendezvous`, a member's
in `new_group` in `groups`, the store-based barrier's in `barriers`). It also fires Gloo's
deadlines when a rank's clock has moved past the deadlines of waits that need it
(`_overdue`), and ends a `Work.wait(timeout=)` that ran out (`_give_up`). A mixin, not a
module of functions, because each step reads and moves the coordinator's per-rank clocks and
answers the rank over its connection.
"""

from __future__ import annotations

import time
from typing import Any

from simdist.script import deadlines
from simdist.script.deadlines import Deadline
from simdist.script.ranks import OpRecord, RankConn
from simdist.script.scriptclocks import script_at

GLOO, WAIT = "gloo", "wait"  # the kinds of `Deadline` this mixin fires
RECHECK_S = 0.05  # how often the coordinator's loop looks for overdue deadlines with no message to say so


def _scope(conn: RankConn, rec: OpRecord) -> tuple[int, str]:
    """The wait an op's deadline ties in (`Deadline.scope`): its group, in its generation."""
    return id(conn.gen), rec.entry.group


def _peers(rec: OpRecord) -> frozenset[int] | None:
    """Whose pair closure ends an op's wait at once (`Deadline.peers`): a send's or receive's
    peer (global rank); None for a collective (which peer it waits on at its step of Gloo's
    algorithm is not modelled) or a receive from any source."""
    e = rec.entry
    return frozenset([e.peer]) if e.op in ("send", "recv") and e.peer is not None else None


def _with_ties(due: list[tuple[RankConn, OpRecord]], ripe: list[tuple[RankConn, OpRecord]]) -> list[tuple[RankConn, OpRecord]]:
    """The overdue ops (`due`) that fire with those whose wait ends now (`ripe`): in a ripe
    one's group, due no later than `deadlines.TIE_S` after it, as `deadlines.next_due` ties
    them (ranks of one group that time out together, a few ms apart on the wall clock)."""
    upto: dict[Any, float] = {}
    for c, r in ripe:
        upto[_scope(c, r)] = max(upto.get(_scope(c, r), 0.0), r.deadline or 0.0)
    return [(c, r) for c, r in due if (k := _scope(c, r)) in upto and (r.deadline or 0.0) <= upto[k] + deadlines.TIE_S]


class GlooTimeoutsMixin:
    """Needs from the class it is mixed into: `gens`, `backend`, `expired`, `_timed`,
    `_live()`, `_pump()` and `_send()` (see `Coordinator`), and the other kinds' deadlines:
    `_init_deadlines()`, `_group_deadlines()`, `_barrier_deadlines()`, `_store_deadlines()`. Each generation of
    ranks (`simdist.script.generations`) times out on its own engine: a deadline is its op's,
    and an op waits only on ranks of its own generation."""

    gens: list[Any]
    backend: str | None
    expired: list[deadlines.Expiry]
    _timed: list[tuple[RankConn, OpRecord]]
    _init_deadlines: Any
    _group_deadlines: Any
    _barrier_deadlines: Any
    _store_deadlines: Any
    _wake_first: Any
    _standstill: bool
    _skip: Any
    reached: Any
    _rechecked = 0.0  # when `_expire_reached` last ran `_overdue` (time.monotonic)

    def _deadlines(self, long: bool = False) -> list[Deadline]:
        """Every wait that a deadline can end now, of every kind (`long`: Gloo ops' at torch's
        default timeout or longer too, `OpRecord.long`)."""
        return (self._init_deadlines() + self._group_deadlines() + self._barrier_deadlines() + self._store_deadlines()
                + self._gloo_deadlines(long))

    def _expire_next(self) -> bool:
        """Nothing can progress: the wait whose deadline comes first in simulated time ends
        (with those of its kind tied with it, `deadlines.next_due`). Returns whether one
        ended (the run goes on); False: no deadline is left, the run hangs."""
        return self._fire_standing(self._deadlines())

    def _fire_standing(self, pending: list[Deadline]) -> bool:
        """`deadlines.fire_next` where every live rank stands still: the skip to the deadline
        moves every rank's script clocks (`ScriptClocksMixin._skip`)."""
        self._standstill = True
        try:
            return deadlines.fire_next(pending)
        finally:
            self._standstill = False

    def _expire_before_wakes(self) -> None:
        """Every live rank is blocked, some but for threads in a timed wait (`rank.timedwait`):
        none of those can post before the first of them wakes, so a deadline due before then
        ends its wait as it would with no such thread (real Gloo times out while they sleep).
        None is: the first of those threads wakes then (`TimedWakesMixin._wake_first`), and
        what it does is the program's (where no deadline is left at all, its timer runs in wall
        time: a thread that never posts would be woken to the cap for nothing). A Gloo op's deadline at torch's default timeout counts
        here (`OpRecord.long`): the wakes run simulated time to it, as the wall clock would."""
        if not any(c.claim.timed for c in self._live()):
            return
        self._overdue()  # (a rank past a deadline while its owner is asleep in timed waits beyond it)
        if not self._hung(timed=True):
            return
        wake = min(w for c in self._live() if (w := c.wake_at()) is not None)
        pending = self._deadlines(long=True)
        if not self._fire_standing([d for d in pending if d.at < wake]) and pending:
            self._wake_first()  # (with no deadline to reach, the wakes are left to the wall clock, as before)

    def _gloo_deadlines(self, long: bool = False) -> list[Deadline]:
        """The live ranks' unfinished Gloo ops with a deadline and their `Work.wait(timeout=)`
        waits (`long`: those at torch's default timeout too)."""
        if self.backend != "gloo":
            return []
        seen: set[int] = set()  # an op can be in `_timed` twice (its group's timeout, then its wait's own)
        ops = []
        for c, rec in self._timed:
            if not rec.done and rec.deadline is not None and c.active() and id(rec) not in seen and (long or not rec.long):
                seen.add(id(rec))
                ops.append(Deadline(rec.deadline, int(c.rank), GLOO, c, (c, rec), self._fire_ops,  # type: ignore[arg-type]
                                    _scope(c, rec), _peers(rec)))
        # (a wait ends only itself, closing nothing: it ties with no other)
        return ops + [Deadline(c.wait_until[1], int(c.rank), WAIT, c, c, self._fire_waits, id(c))  # type: ignore[arg-type]
                      for g in self.gens for c in g.by_rank.values() if c.wait_until is not None and c.active()]

    def _fire_ops(self, due: list[tuple[RankConn, OpRecord]]) -> None:
        """Gloo's timeout ends these ops' waits: every rank waited until then."""
        self._fire(due)
        for conn, rec in due:
            conn.clock = max(conn.clock, rec.deadline or 0.0)
        self._pump()

    def _fire_waits(self, conns: list[RankConn]) -> None:
        """These ranks' `Work.wait(timeout=)` ran out first: only the waits end (`_give_up`)."""
        for conn in conns:
            self._give_up(conn)
        self._pump()

    def _overdue(self, posting: RankConn | None = None) -> None:
        """Ranks' simulated clocks moved on without them posting what other ranks' waits need
        from them: the waits whose deadline lies before such a rank's clock ran out first (on
        real Gloo they time out while it still computes or sleeps). Called at each message
        that moves a clock or adds a deadline, before the rank posts anything (it then meets
        closed pairs). Conservative in simulated time: fires only once no rank can post
        anything before the deadline, or when the late rank is `posting` (about to post, or
        leaving, at its clock: what waits on it cannot have completed in time)."""
        if self.backend != "gloo":
            return
        self._timed = [(c, rec) for c, rec in self._timed if not rec.done]
        if not self._timed and not any(c.wait_until is not None for g in self.gens for c in g.by_rank.values()):
            return
        for gen in self.gens:
            if gen.complete():
                self._overdue_in(gen, posting)

    def _overdue_in(self, gen: Any, posting: RankConn | None) -> None:
        """`_overdue` for one generation: its ranks' clocks against its waits."""
        live = [c for c in self._live() if c.gen is gen]
        waits = [c for c in gen.by_rank.values() if c.wait_until is not None]
        pending: dict[int, list[Deadline]] | None = None  # id(conn) -> its deadlines of every kind

        def freed(c: RankConn, at: float, scope: Any) -> bool:  # (the deadlines are gathered only when one is asked)
            nonlocal pending
            if pending is None:
                pending = {}
                for d in self._deadlines(long=True):
                    pending.setdefault(id(d.conn), []).append(d)
            return deadlines.frees_before(pending.get(id(c), []), at, GLOO, scope)

        def overdue(rec: OpRecord, at: float, owner: RankConn) -> bool:
            scope = _scope(owner, rec)
            return deadlines.overdue(gen.engine.awaits, rec.call, at, owner, live, posting,
                                     lambda c: freed(c, at, scope))

        def now(rec: OpRecord, at: float, owner: RankConn) -> bool:
            """An overdue wait ends now: the late rank posts now, or the wall clock got to it (a
            rank runs in wall time past it, a peer's sleep: it fires then, as on real Gloo,
            `scriptclocks`; else `_expire_reached` comes back)."""
            forced = posting is not None and posting.clock > at and gen.engine.awaits(rec.call, posting.rank)
            return forced or self.reached(owner, script_at(rec, at))

        for c in waits:
            assert c.wait_until is not None
            if c.active() and overdue(*c.wait_until, c) and now(*c.wait_until, c):
                self._give_up(c)
        latest = max((c.clock for c in live), default=0.0)  # (no rank past a deadline: not overdue; most ops
        # carry torch's default 30 min now, `OpRecord.long`: this keeps them from costing each message)
        due = [(c, r) for c, r in self._timed if c.gen is gen and c.active() and r.deadline is not None
               and r.deadline < latest and overdue(r, r.deadline, c)]
        if due := _with_ties(due, [(c, r) for c, r in due if now(r, r.deadline or 0.0, c)]):
            self._fire(sorted(due, key=lambda cr: (cr[1].deadline, cr[0].rank)))
            self._pump()

    def _give_up(self, conn: RankConn) -> None:
        """The rank's `Work.wait(timeout=)` ran out before its op completed: the wait raises
        torch's "Operation timed out!", the op goes on (with its group's own deadline)."""
        assert conn.wait_until is not None
        rec, until = conn.wait_until
        conn.wait_until = None
        conn.unblock()
        conn.clock = max(conn.clock, until)
        self._skip(conn, script_at(rec, until), at=until)
        if rec in conn.to_sync:  # it did not wait for the op after all
            conn.to_sync.remove(rec)
            rec.waited = False
        self._send(conn, {"t": "waited", "id": rec.id, "error": deadlines.WAIT_TIMED_OUT})

    def _expire_reached(self) -> None:
        """`_overdue` again every `RECHECK_S` of wall time: deadlines it left to the wall clock
        (`reached`) fire once it gets there, and those a rank made overdue by blocking where no
        message says so (a store request, `keystore`) fire too."""
        now = time.monotonic()
        if now - self._rechecked >= RECHECK_S:
            self._rechecked = now
            self._overdue()

    def _fire(self, due: list[tuple[RankConn, OpRecord]]) -> None:
        """Gloo's timeout ends these waits at their deadlines, together (`deadlines`,
        `Engine.time_out`)."""
        expired: dict[Any, list[tuple[Any, str]]] = {}
        for conn, rec in due:
            assert rec.deadline is not None and rec.limit_s is not None
            blocked = conn.block is not None and rec.id in conn.block.ids
            frames = conn.block.frames if blocked and conn.block is not None else []
            msg = deadlines.message(rec.entry.op, rec.limit_s)
            self.expired.append(deadlines.Expiry(conn.rank, rec.entry, frames, rec.deadline, rec.limit_s, msg))
            rec.ended_at = rec.deadline
            expired.setdefault(conn.gen, []).append((rec.call, msg))
            if blocked:
                conn.clock = max(conn.clock, rec.deadline)
                self._skip(conn, script_at(rec, rec.deadline), at=rec.deadline)  # sent before the op's end
        for gen, calls in expired.items():
            gen.engine.time_out(calls)
