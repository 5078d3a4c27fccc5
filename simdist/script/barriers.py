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
else can progress the timed waits raise (`_barrier_expire`, as `groups._group_expire` ends a
group's creation), their clocks at their entry + the turns.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass
from datetime import timedelta
from typing import Any

from simdist.script.deadlines import TIE_S
from simdist.script.ranks import Block, RankConn
from simdist.script.stores import STORE_PREFIX

STORE_BARRIER = "waiting in the store-based barrier (TORCH_DIST_INIT_BARRIER=1)"
BARRIER_KEY = "store_based_barrier_key"  # torch's STORE_BASED_BARRIER_PREFIX


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

    def raises_after(self) -> float | None:
        """When it raises, after its entry: the first whole turn at which its timeout has
        passed (torch checks only after a turn's wait timed out); None: never (the default)."""
        if self.limit_s is None:
            return None
        return max(1, math.ceil(self.limit_s / self.turn_s)) * self.turn_s


def barrier_timeout(rank: int, key: str, count: int, joined: int, limit_s: float, turn_s: float) -> tuple[str, str]:
    """What rank `rank` raises when its wait in the barrier of group `key` runs out."""
    store_key = f"{BARRIER_KEY}:{key}"
    return "DistStoreError", (
        f"Timed out initializing process group in store based barrier on rank {rank}, for key: {store_key} "
        f"(world_size={count}, num_workers_joined={joined}, timeout={timedelta(seconds=limit_s)} "
        f"error=wait timeout after {round(turn_s * 1000)}ms, keys: {STORE_PREFIX}/0//{store_key}:last_worker)")


class StoreBarrierMixin:
    """The coordinator's side of the store-based barrier. Needs `gens`, `measure_compute`,
    `_send` and `_next_deadline` (`expiry.GlooTimeoutsMixin`)."""

    gens: list[Any]
    measure_compute: bool
    _send: Any
    _next_deadline: Any

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
                self._barrier_failed(w, key, len(waiting))
        waiting[conn.rank] = BarrierWait(conn, int(h["req"]), conn.clock, count,  # type: ignore[index]
                                         None if h.get("to") is None else float(h["to"]), float(h.get("turn") or 10.0))
        conn.wait_in_request(Block([], time.time(), list(h.get("frames") or []), STORE_BARRIER))
        if len(waiting) >= count:
            here = [w for w in conn.gen.barriers.pop(key).values() if not w.failed]
            start = max(w.conn.clock for w in here)
            for w in here:
                w.conn.clock = max(w.conn.clock, start)
                w.conn.answered()
                self._send(w.conn, {"t": "reply", "req": w.req})

    def _barrier_failed(self, w: BarrierWait, key: str, joined: int) -> None:
        """`w`'s timeout ran out: it raises torch's error at its entry + the turns it waited."""
        w.failed, w.conn.clock = True, w.clock + (w.raises_after() or 0.0)
        w.conn.answered()
        error = barrier_timeout(int(w.conn.rank), key, w.count, joined, w.limit_s or 0.0, w.turn_s)  # type: ignore[arg-type]
        self._send(w.conn, {"t": "reply", "req": w.req, "raise": error})

    def _barrier_expire(self) -> bool:
        """Nothing else can progress: the ranks waiting in a store-based barrier whose timeout
        runs out first raise torch's error (`barrier_timeout`), those within `deadlines.TIE_S`
        of the earliest, and only if no Gloo timeout comes before (`_next_deadline`): a rank
        whose recv times out at 2 s may catch it and enter the barrier, making the count whole
        before the others' 10 s turn ends. Whether one did."""
        timed = [(w.clock + after, w, key, waiting) for gen in self.gens for key, waiting in gen.barriers.items()
                 for w in waiting.values()
                 if not w.failed and (after := w.raises_after()) is not None and w.conn.active()]
        if not timed:
            return False
        first = min(t for t, *_ in timed)
        gloo = self._next_deadline()
        if gloo is not None and gloo < first:
            return False
        for t, w, key, waiting in sorted(timed, key=lambda x: (x[0], x[1].conn.rank)):
            if t <= first + TIE_S:
                self._barrier_failed(w, key, len(waiting))
        return True
