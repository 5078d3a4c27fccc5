"""The simulated `init_process_group`: a rank's init returns once its whole world has joined.

On real Gloo a rank's init does not return before every rank of the world has called it:
the ranks meet at the c10d store, then ProcessGroupGloo's constructor connects the full
mesh, each rank waiting at the store for every peer's address. Measured on torch 2.13
(`tests/scripts/init_waits_for_world.py`, 3 ranks, the last one late):

* a rank that comes late holds up the others' init until it comes; then all go on;
* with `init_process_group(timeout=T)` a waiting rank raises, T after it entered init,
  `DistStoreError: wait timeout after <T ms>ms, keys: <prefix>/0//cpu//0/<r>`, r the lowest
  rank whose address was not there (Gloo reads the peers' keys in rank order); the key's
  prefix is the store's (`/default_pg` for env:// and torchrun, the launcher's own for
  `simdist real`). Without `timeout=` torch's default is 30 min: not modelled, a wait for
  a rank that never comes is reported as the hang it is;
* a rank that comes after its peers timed out and left fails to connect to them:
  `RuntimeError: Gloo connectFullMesh failed with ... Connection refused`.

The simulated ranks have no store: the coordinator is the rendezvous. It answers a rank's
init once the generation (`simdist.script.generations`) has all its ranks, and sets every
member's clock to the latest one's (the world's last arrival; in the first generation every
clock is 0 then, the convention that a rank's clock starts at its init). Whether a rank came
too late for a peer's timeout is judged on the wall clock when both are their processes'
first init: before it nothing is simulated, the ranks run the script's code for real, so
when each entered init is the model (its sleeps, compute, I/O and waits for a file a peer
writes alike; counting its sleeps alone made a rank that polls for a peer's file late by the
peer's work: a timeout real Gloo does not have), and a first init's wait with a timeout
ends at its entry + T on the wall clock, while its peers still compute or do other work
(`_init_timeouts`), as the store's wait does. Later inits (a generation after
`destroy_process_group`) are judged on the simulated clocks. A rank that never
comes: the launcher knows when the process it started for that rank (torchrun-style, one
process per rank) ended without joining; then the waits with a timeout end with the error
above and the others are a hang, explained by `notes`. For a script that starts its own
ranks (`mp.spawn`) which process would have been which rank is unknown: the others wait, as
on real Gloo, until the processes end or Ctrl-C.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simdist.script.generations import latest
from simdist.script.ranks import RankConn, exit_words

INIT_WAIT = "waiting in init_process_group"  # how a rank that waits there for its world is reported
STORE_PREFIX = "/default_pg"  # the default group's store prefix under env:// and torchrun
FULL_MESH = "Gloo connectFullMesh failed with"  # what a failed connect at init starts with
# the simulator's one wording of a late rank's failed connect (a race of real Gloo: `simdist.testing.races`)
REFUSED = f"{FULL_MESH} [gloo/transport/tcp/pair.cc] timed out connecting: SO_ERROR: Connection refused"


@dataclass
class InitWait:
    """A rank waiting in its init: the request to answer, when its message came (wall time),
    when it entered init (wall time, its process's first init only: `came_after`), its
    simulated clock then, its timeout and its call site."""

    req: int
    since: float
    at: float | None
    clock: float
    limit_s: float | None
    frames: list[Any]

    def came_after(self, other: InitWait) -> bool:
        """`other` entered init after this wait's timeout ran out: on the wall clock when both
        are first inits (nothing is simulated before one), else on the simulated clocks."""
        if self.limit_s is None:
            return False
        if self.at is not None and other.at is not None:
            return other.at - self.at > self.limit_s
        return other.clock - self.clock > self.limit_s


def store_timeout(limit_s: float, missing: int) -> tuple[str, str]:
    """What a rank raises when its init's wait at the store for rank `missing` runs out."""
    return "DistStoreError", f"wait timeout after {round(limit_s * 1000)}ms, keys: {STORE_PREFIX}/0//cpu//0/{missing}"


def ended_without_init(x: dict[str, Any], at: bool = False) -> str:
    """How a process that never called init ended (`rank.exits`' report), in words; `at`:
    with the line."""
    where = x.get("where") if at else None
    return f"{exit_words(x)} before init_process_group" + (
        f" at {where[0].rsplit('/', 1)[-1]}:{where[1]}" if where else "")


def _blocked_elsewhere(gens: list[Any], rank: int, gen: Any) -> bool:
    """`rank`'s process is blocked in another generation (torchrun-style: one process a rank)."""
    c = latest(gens, rank)
    return c is not None and c.gen is not gen and c.active() and c.blocked()


def _timed_waits(gen: Any) -> list[RankConn]:
    """`gen`'s live ranks waiting in init with a timeout, in rank order (the order their
    errors are given): the ranks whose wait a deadline can end."""
    return [c for c in sorted(gen.by_rank.values(), key=lambda c: c.rank)
            if c.init_wait is not None and c.init_wait.limit_s is not None and c.active()]


class RendezvousMixin:
    """The coordinator's side of init's rendezvous. Needs `gens`, `_send`, `no_init`, and
    `never_joins` (ranks whose launched process ended: they will join no generation)."""

    gens: list[Any]
    _send: Any
    never_joins: Callable[[], set[int]] = set  # `serve`'s `ended`: ranks whose launched process ended
    no_init: dict[int, dict[str, Any]]  # rank -> how its process ended without calling init

    def _never_came(self, h: dict[str, Any]) -> None:
        """A torchrun-style rank's process ends before it called init (`rank.exits`): how and where."""
        self.no_init.setdefault(int(h["rank"]), dict(h["never"]))

    def _starting(self) -> bool:
        """Start-up, which the watchdog does not count: no rank yet, or the latest generation
        still waiting for ranks (importing torch on a busy host takes long)."""
        return not self.gens or not self.gens[-1].complete()

    def _init_timeouts(self) -> None:
        """First inits whose timeout ran out on the wall clock end with the store's error now,
        whatever their peers do meanwhile (compute before their own init, poll for a file):
        real Gloo's store wait raises at its entry + T. (Later inits, on the simulated clocks,
        end at a late peer's arrival, `_arrive`, or once nothing can progress, `_init_expire`.)"""
        now = time.time()
        for gen in (g for g in self.gens if not g.complete()):
            for c in _timed_waits(gen):
                w = c.init_wait
                if w is not None and w.at is not None and now - w.at > (w.limit_s or 0.0):
                    self._init_failed(c, gen)

    def _arrive(self, conn: RankConn, gen: Any, h: dict[str, Any]) -> None:
        """`conn` joined `gen` (its membership is made): it waits until the world is complete,
        or answers at once the rank that comes after a peer's init timed out."""
        new = conn.init_wait = InitWait(int(h["req"]), time.time(), None if h.get("at") is None else float(h["at"]),
                                        conn.clock, None if h.get("to") is None else float(h["to"]),
                                        list(h.get("frames") or []))
        for c in list(gen.by_rank.values()):  # those whose timeout ran out before this arrival
            if c is not conn and c.init_wait is not None and c.init_wait.came_after(new):
                self._init_failed(c, gen)
        if not gen.complete():
            return
        waiting = [c for c in gen.by_rank.values() if c.init_wait is not None]
        if gen.failed:  # every address is there, but a peer's is that of a process that left
            gone = gen.failed[0][0]
            for c in waiting:
                self._answer(c, gen, ("RuntimeError", f"{REFUSED} (rank {gone} timed out in init_process_group)"))
            return
        start = max(c.clock for c in gen.by_rank.values())
        for c in waiting:
            c.clock = max(c.clock, start)
            self._answer(c, gen, None)

    def _answer(self, conn: RankConn, gen: Any, failure: tuple[str, str] | None) -> None:
        w, conn.init_wait = conn.init_wait, None
        assert w is not None
        self._send(conn, {"t": "reply", "req": w.req, "error": None, "backend": getattr(self, "backend", None),
                          "gen": gen.index, "raise": failure})

    def _init_failed(self, conn: RankConn, gen: Any) -> None:
        """`conn`'s init timed out at the store: the lowest rank not there by its deadline."""
        w = conn.init_wait
        assert w is not None and w.limit_s is not None
        there = {r for r, c in gen.by_rank.items() if c.init_wait is None or not w.came_after(c.init_wait)}
        missing = min(r for r in range(gen.world_size) if r not in there)
        conn.clock = w.clock + w.limit_s
        gen.failed.append((conn.rank, missing, w.limit_s, w.frames))
        self._answer(conn, gen, store_timeout(w.limit_s, missing))

    def _unjoinable(self, gen: Any) -> bool:
        """`gen` lacks ranks that cannot come now: their launched processes ended, or the
        process is blocked in an earlier generation (a hang there, if every rank is blocked)."""
        missing = [r for r in range(gen.world_size) if r not in gen.by_rank]
        gone = self.never_joins() if missing else set()
        return bool(missing) and all(r in gone or _blocked_elsewhere(self.gens, r, gen) for r in missing)

    def _init_expire(self) -> bool:
        """Nothing else can progress: in a generation whose missing ranks will never come, the
        inits with a timeout end with the store's error (the rest wait: a hang). Whether one did."""
        fired = False
        for gen in self.gens:
            if gen.complete() or not self._unjoinable(gen):
                continue
            for c in _timed_waits(gen):
                self._init_failed(c, gen)
                fired = True
        return fired

    def init_notes(self) -> list[str]:
        """Why ranks wait in (or timed out of) init: which ranks never came, and how."""
        notes = []
        for gen in self.gens:
            missing = [r for r in range(gen.world_size) if r not in gen.by_rank]
            waiting = sorted(r for r, c in gen.by_rank.items() if c.init_wait is not None)
            if waiting and missing:
                gone = sorted(set(missing) & self.never_joins())
                why = (f"rank(s) {gone} ended before calling it" if gone == missing else
                       f"rank(s) {missing} never called it" + (f" (of them {gone} ended)" if gone else ""))
                why += "".join(f"; rank {r} {ended_without_init(self.no_init[r], at=True)}"
                               for r in gone if r in self.no_init)
                notes.append(f"init: rank(s) {waiting} wait in init_process_group for the whole world of "
                             f"{gen.world_size} (real Gloo's store rendezvous): {why}")
            for rank, late, limit_s, _frames in gen.failed:
                notes.append(f"init: rank {rank}'s init_process_group timed out after its {limit_s:g} s timeout "
                             f"waiting for rank {late}")
        return notes
