"""The simulated store-based barrier (TORCH_DIST_INIT_BARRIER=1: `c10d._store_based_barrier`).

With the variable set torch ends `new_group` (without use_local_synchronization) with a
barrier at the default store over the whole world, non-members too: each rank adds one to
the key `store_based_barrier_key:<group>`, the one that makes the count whole sets
`<key>:last_worker`, and the others wait for that key in turns of `logging_interval`
(max(10 s, 10 s + world/1000 s)). After each turn that timed out a rank checks whether the
group's `timeout=` has passed since it started waiting and, if so, raises (torch 2.13,
measured: `tests/scripts/store_barrier_timeout.py 1`, 3 ranks, rank 2 never enters, ranks 0
and 1 raise at 10.003 s):

    DistStoreError: Timed out initializing process group in store based barrier on rank 0,
    for key: store_based_barrier_key:1 (world_size=3, num_workers_joined=2,
    timeout=0:00:01 error=wait timeout after 10003ms, keys: <prefix>/0//store_based_barrier_key:1:last_worker)

So the raise comes at the first whole turn past the timeout, not at the timeout. A rank that
enters after a peer's raise still counts it (the store's counter never goes down): if it
makes the count whole it and the peers still waiting go on.

The coordinator is the store here: a rank's request (`rank.patches._patch_store_based_barrier`)
says the count, its timeout (None: torch's default, 30 min for Gloo, which stays a hang) and
its turn. A waiting rank is blocked (`ranks.Block`, labelled `STORE_BARRIER`); once nothing
else can progress the timed waits raise in their turn among every kind of deadline
(`_barrier_deadlines`, `deadlines.next_due`), their clocks at their entry + the turns.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from datetime import timedelta
from typing import Any

from simdist.script.deadlines import Deadline
from simdist.script.gathering import Gathering, group_words, raises_words, span
from simdist.script.ranks import Block, RankConn, user_line, waiting_in
from simdist.script.stores import BARRIER_CALL, BARRIER_KEY, STORE_PREFIX

STORE_BARRIER = waiting_in(BARRIER_CALL)  # how a rank waiting there is reported
STORE_BARRIER_KIND = "store_barrier"  # its kind of `Deadline`


@dataclass
class BarrierWait:
    """A rank in a store-based barrier: its request, its simulated clock at entry, how many
    ranks the barrier counts, its timeout (None: torch's default) and the length of one of
    its waits for the last worker's key."""

    conn: RankConn
    req: int
    clock: float
    count: int
    limit_s: float | None
    turn_s: float
    failed: bool = False  # its timeout ran out: it raised (its count stays in the store)
    frames: list[Any] = field(default_factory=list)  # its call site (raw frames)
    since: float = field(default_factory=time.time)  # when it came (wall time: the status lines')

    def raises_after(self, default_s: float | None = None) -> float | None:
        """When it raises, after its entry: the first whole turn at which its timeout (or
        `default_s`, torch's default, where it has none) has passed (torch checks only after a
        turn's wait timed out); None: never (no timeout, no default given)."""
        limit = self.limit_s if self.limit_s is not None else default_s
        if limit is None:
            return None
        return max(1, math.ceil(limit / self.turn_s)) * self.turn_s


def barrier_timeout(rank: int, key: str, count: int, joined: int, limit_s: float, turn_s: float) -> tuple[str, str]:
    """What rank `rank` raises when its wait in the barrier of group `key` runs out."""
    store_key = f"{BARRIER_KEY}:{key}"
    return "DistStoreError", (
        f"Timed out initializing process group in store based barrier on rank {rank}, for key: {store_key} "
        f"(world_size={count}, num_workers_joined={joined}, timeout={timedelta(seconds=limit_s)} "
        f"error=wait timeout after {round(turn_s * 1000)}ms, keys: {STORE_PREFIX}/0//{store_key}:last_worker)")


def joined_by(waiting: dict[int, BarrierWait], at: float) -> int:
    """How many ranks had entered the barrier (added to its counter) by simulated time `at`,
    one that raised before too (the counter never goes down): torch reads the counter
    (`store.add(key, 0)`) when a turn's wait timed out and reports it as `num_workers_joined`.
    Counted on the simulated clocks, not in the order the coordinator heard of the entries:
    a rank whose clock ran ahead (a Gloo timeout fired at once) may be heard of first."""
    return sum(1 for w in waiting.values() if w.clock <= at)


class StoreBarrierMixin:
    """The coordinator's side of the store-based barrier. Needs `gens`, `measure_compute`,
    `rendezvous`, `_send` and `_default_timeout_s()`."""

    gens: list[Any]
    measure_compute: bool
    rendezvous: bool
    _send: Any
    _default_timeout_s: Any

    def _store_barrier(self, conn: RankConn, h: dict[str, Any]) -> None:
        """A rank entered torch's store-based barrier under `key` (a group's name): it returns
        once `count` ranks of its generation entered it, as the store's counter says. Waits
        whose timeout ran out before this arrival (the simulated clocks) raise first."""
        if conn.gen is None:
            return
        conn.advance(h, self.measure_compute)  # past its waits and compute
        key, count = str(h["key"]), int(h["count"])
        waiting: dict[int, BarrierWait] = conn.gen.barriers.setdefault(key, {})
        for w in list(waiting.values()):
            after = w.raises_after()
            if not w.failed and after is not None and w.clock + after < conn.clock:
                self._barrier_failed(w, key, waiting)
        frames = list(h.get("frames") or [])
        waiting[conn.rank] = BarrierWait(conn, int(h["req"]), conn.clock, count,  # type: ignore[index]
                                         None if h.get("to") is None else float(h["to"]), float(h.get("turn") or 10.0),
                                         frames=frames)
        conn.wait_in_request(Block([], time.time(), frames, STORE_BARRIER))
        if len(waiting) >= count:
            here = [w for w in conn.gen.barriers.pop(key).values() if not w.failed]
            start = max(w.conn.clock for w in here)
            for w in here:
                w.conn.clock = max(w.conn.clock, start)
                w.conn.answered()
                self._send(w.conn, {"t": "reply", "req": w.req})

    def _barrier_failed(self, w: BarrierWait, key: str, waiting: dict[int, BarrierWait]) -> None:
        """`w`'s timeout ran out: it raises torch's error at its entry + the turns it waited,
        with the count of the ranks that had entered by then (`joined_by`)."""
        w.failed, w.conn.clock = True, w.clock + (w.raises_after() or 0.0)
        w.conn.answered()
        joined = joined_by(waiting, w.conn.clock)
        error = barrier_timeout(int(w.conn.rank), key, w.count, joined, w.limit_s or 0.0, w.turn_s)  # type: ignore[arg-type]
        self._send(w.conn, {"t": "reply", "req": w.req, "raise": error})

    def _barrier_deadlines(self) -> list[Deadline]:
        """The ranks waiting in a store-based barrier with a timeout: each raises torch's error
        (`barrier_timeout`) at the first whole turn past it, in its turn among every kind of
        deadline (`expiry.GlooTimeoutsMixin._expire_next`): a rank whose recv times out at 2 s
        may catch it and enter the barrier, making the count whole before the others' 10 s
        turn ends."""
        return [Deadline(w.clock + after, int(w.conn.rank), STORE_BARRIER_KIND, w.conn, (w, key, waiting),
                         self._fire_barriers, id(waiting))  # (ties only in its own barrier)
                for gen in self.gens for key, waiting in gen.barriers.items() for w in waiting.values()
                if not w.failed and (after := w.raises_after()) is not None and w.conn.active()]

    def _fire_barriers(self, due: list[tuple[BarrierWait, str, dict[int, BarrierWait]]]) -> None:
        """Their turn came first (`deadlines.next_due`): these barrier waits raise torch's error."""
        for w, key, waiting in due:
            self._barrier_failed(w, key, waiting)

    def _barriers_here(self) -> list[tuple[str, dict[int, BarrierWait], list[BarrierWait]]]:
        """Each barrier in progress (its key, its entries, failed ones too: they are counted)
        with the ranks that wait in it now (live, their timeout not run out)."""
        return [(key, waiting, here) for gen in self.gens for key, waiting in gen.barriers.items()
                if (here := [w for w in waiting.values() if w.conn.active() and not w.failed])]

    def barrier_gatherings(self) -> list[Gathering]:
        """The simulated side's ranks waiting in a store-based barrier, for the status lines
        (`initwatch`), in the words of a group's creation (`gathering`): the barrier counts the
        whole world, and real torch raises at the first turn past each wait's timeout (torch's
        default where it has none). The real side's come with its stalls (`rank.stall`)."""
        if not self.rendezvous:
            return []
        found = []
        for key, waiting, here in self._barriers_here():
            count, default_s = here[0].count, self._default_timeout_s()
            ends = [(w, w.raises_after(default_s) or 0.0) for w in here]
            errors = [(int(w.conn.rank), barrier_timeout(int(w.conn.rank), key, count, len(waiting),  # type: ignore[arg-type]
                                                         w.limit_s if w.limit_s is not None else default_s, w.turn_s))
                      for w in here]
            found.append(Gathering({int(w.conn.rank): (STORE_BARRIER, user_line(w.frames) or "?", w.since)  # type: ignore[arg-type]
                                    for w in here}, group_words(list(range(count))),
                                   [r for r in range(count) if r not in waiting],
                                   raises_words(errors, min(after for _w, after in ends))))
        return found

    def barrier_default_timeouts(self) -> list[str]:
        """What the barrier's waits left without a timeout raise on real torch (a hang here):
        at the first turn of the wait past torch's default (30 min for Gloo), in the words of
        init's (`rendezvous.default_timeouts`)."""
        default_s, notes = self._default_timeout_s(), []
        for key, waiting, here in self._barriers_here():
            for w in sorted((w for w in here if w.limit_s is None), key=lambda w: int(w.conn.rank)):  # type: ignore[arg-type]
                kind, message = barrier_timeout(int(w.conn.rank), key, w.count, len(waiting), default_s, w.turn_s)  # type: ignore[arg-type]
                notes.append(f"{BARRIER_CALL}: on real torch rank {w.conn.rank}'s wait ends after its default "
                             f"timeout ({span(default_s)}), at its first turn past it ({span(w.raises_after(default_s) or 0.0)} "
                             f"after it entered): {kind}: {message}")
        return notes
