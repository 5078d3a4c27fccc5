"""The simulated `init_process_group`: a rank's init returns once its whole world has joined.

On real Gloo a rank's init does not return before every rank of the world has called it:
the ranks meet at the c10d store, then ProcessGroupGloo's constructor connects the full
mesh, each rank waiting at the store for every peer's address. Measured on torch 2.13
(`tests/scripts/init_waits_for_world.py`, 3 ranks, the last one late):

* a rank that comes late holds up the others' init until it comes; then all go on;
* with `init_process_group(timeout=T)` a waiting rank raises the store's error, at a deadline
  and with a wording that depend on who hosts the store (`simdist.script.stores`: torchrun's
  agent, or rank 0 under env:// and tcp://, the mp.spawn tutorials' shape); `fate` gives
  each waiting rank's. Without `timeout=` torch's default (30 min for Gloo) is the deadline:
  a hang proven here keeps its verdict and its notes say what real torch raises then
  (`default_timeouts`); a first init, judged on the wall clock, ends there;
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
on real Gloo, until their deadlines (torch's default where the script gives none), or until
the script's own mp.spawn ends them once a rank raised.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from simdist.script.deadlines import Deadline
from simdist.script.generations import latest
from simdist.script.ranks import RankConn, exit_words, file_line, waiting_in
from simdist.script.scriptclocks import waited_to
from simdist.script.stores import (
    CONNECT_FACTOR,
    DEFAULT_TIMEOUT_S,
    SERVER_GONE,
    Address,
    connect_timeout,
    host_timeout,
    host_wait_s,
    store_timeout,
)
from simdist.vocab import FULL_MESH

INIT_WAIT = waiting_in("init_process_group")  # how a rank that waits there for its world is reported
INIT = "init"  # its kind of `Deadline`
# the simulator's one wording of a late rank's failed connect (a race of real Gloo: `simdist.races`)
REFUSED = f"{FULL_MESH} [gloo/transport/tcp/pair.cc] timed out connecting: SO_ERROR: Connection refused"


@dataclass
class InitWait:
    """A rank waiting in its init: the request to answer, when its message came (wall time),
    when it entered init (wall time, its process's first init only: `gap`), its simulated
    clock then, its timeout, its call site, and the address where rank 0 hosts the store
    (`stores.rank0_hosts`; None: the store exists before init)."""

    req: int
    since: float
    at: float | None
    clock: float
    limit_s: float | None
    frames: list[Any]
    host: Address | None = None
    proc: float | None = None  # the script's clock when it came (`scriptclocks.waited_to`)


def gap(a: InitWait, b: InitWait) -> float:
    """How long after `a` entered init `b` did (negative: before): on the wall clock when both
    are first inits (nothing is simulated before one), else on the simulated clocks."""
    if a.at is not None and b.at is not None:
        return b.at - a.at
    return b.clock - a.clock


def entered_at(gen: Any, rank: int) -> float | None:
    """When `rank` entered its init in `gen` on the simulated clocks of an init that failed
    (a waiter's clock runs from its own entry, 0 on a first init): the first entrant's clock
    plus how much later `rank` came (`gap`). None: it never entered."""
    if (w := gen.entered.get(rank)) is None:
        return None
    first = min(gen.entered.values(), key=lambda e: gap(w, e))
    return first.clock + gap(first, w)


@dataclass
class Failure:
    """How a rank's init ends at the rendezvous: `after` seconds after it entered, with
    `error`; `why` for the notes; `posted`: its Gloo address was in the store when it left
    (its peers' connect to it is then refused once the world is there)."""

    after: float
    error: tuple[str, str]
    why: str
    posted: bool = True
    rank: int = -1
    frames: list[Any] | None = None


def _connects(w0: InitWait, w: InitWait, host_ends: float | None) -> bool:
    """Rank 0's store server answers `w`'s connect: it came before `w` gave up, and `w`
    came before the server closed (`host_ends`, after rank 0's entry)."""
    in_time = w.limit_s is None or gap(w, w0) <= CONNECT_FACTOR * w.limit_s
    return in_time and (host_ends is None or gap(w0, w) <= host_ends)


def _host_ends(gen: Any) -> float | None:
    """When (after its entry) rank 0's store server gives up waiting for clients and closes,
    or None if it does not (no timeout, or every rank's client joined in time)."""
    w0 = gen.entered.get(0)
    if w0 is None or w0.limit_s is None:
        return None
    wait = host_wait_s(w0.limit_s)
    joined = sum(1 for e in gen.entered.values() if gap(w0, e) <= wait and _connects(w0, e, None))
    return None if joined >= gen.world_size else wait


def fate(gen: Any, rank: int, default_s: float | None = None) -> Failure | None:
    """How `rank`'s init in `gen` ends if its world is not there in time, given the entries
    known so far (a later entry cannot change an earlier deadline); None: it waits for good.
    `default_s`: the timeout of an init that gave none (torch's default: `default_timeouts`);
    without it such a wait has no deadline."""
    w = gen.entered[rank]
    t = w.limit_s if w.limit_s is not None else default_s
    if t is None:
        return None
    if w.host is None:  # the store was there before init: the wait for the peers' addresses
        missing = min((r for r in range(gen.world_size) if r not in gen.entered or gap(w, gen.entered[r]) > t),
                      default=None)
        return None if missing is None else Failure(t, store_timeout(t, missing), f"timed out after its {t:g} s timeout waiting for rank {missing}")
    ends = _host_ends(gen)
    if rank == 0:
        wait = host_wait_s(t)
        joined = [r for r, e in sorted(gen.entered.items()) if gap(w, e) <= wait and _connects(w, e, None)]
        return None if len(joined) >= gen.world_size else Failure(wait, host_timeout(t, len(joined), gen.world_size),
                       f"hosting the store, timed out after {wait:g} s waiting for clients (joined: ranks {joined})",
                       posted=False)
    w0 = gen.entered.get(0)
    if w0 is None or not _connects(w0, w, ends):
        return Failure(CONNECT_FACTOR * t, connect_timeout(t, w.host),
                       f"found no store at rank 0's address in its {t:g} s timeout", posted=False)
    key = max(gap(w, w0), 0.0) + t  # connected: it waits for rank 0's address, posted once every client joined
    joins = [gap(w, e) for e in gen.entered.values() if _connects(w0, e, ends)]
    if ends is None and len(joins) >= gen.world_size and max(joins) <= key:
        return None
    if ends is not None and gap(w, w0) + ends < key:
        return Failure(gap(w, w0) + ends, SERVER_GONE, "lost the store when rank 0's server closed")
    return Failure(key, store_timeout(t, 0), f"timed out after its {t:g} s timeout waiting for rank 0")


def ended_without_init(x: dict[str, Any], at: bool = False) -> str:
    """How a process that never joined a world ended (`rank.exits`' report), in words; `at`:
    with the line and the error's first line (a traceback's last). Its init may have been
    called and raised (torch's rendezvous errors, `rank.patches`): then it says so."""
    where = x.get("where") if at else None
    line = f" at {file_line(where)}" if where else ""
    error = x.get("error")
    said = f"{error['type']}: {(str(error['message']).strip().splitlines() or [''])[0]}" if error else ""
    if x.get("in_init") and error:
        return f"called init_process_group{line}, which raised {said}"
    if at and error:
        return f"raised {said} before init_process_group{line}"
    return f"{exit_words(x)} before init_process_group{line}"


def process_words(x: dict[str, Any]) -> str:
    """Which process of the run a report that came without a rank is (`_never_came`): a child
    the script started with mp.spawn, or the script's own process."""
    if x.get("spawn") is None:
        return f"the script's own process (pid {x['pid']})"
    return f"a process of the run (pid {x['pid']}, mp.spawn's process {x['spawn']})"


def left_words(x: dict[str, Any]) -> str:
    """How a process of the run without a rank ended before init (`_never_came`), in words."""
    return f"{process_words(x)} {ended_without_init(x['never'], at=True)}"


def _blocked_elsewhere(gens: list[Any], rank: int, gen: Any) -> bool:
    """`rank`'s process is blocked in another generation (torchrun-style: one process a rank)."""
    c = latest(gens, rank)
    return c is not None and c.gen is not gen and c.active() and c.blocked()


def _timed_waits(gen: Any, default_s: float | None = None) -> list[tuple[RankConn, Failure]]:
    """`gen`'s live ranks waiting in init with a deadline, in rank order (the order their
    errors are given), each with how its wait ends: the ranks whose wait a deadline can end
    (`default_s`: also those without a timeout, at torch's default)."""
    waits = [c for c in sorted(gen.by_rank.values(), key=lambda c: c.rank) if c.init_wait is not None and c.active()]
    return [(c, f) for c in waits if (f := fate(gen, c.rank, default_s)) is not None]


class RendezvousMixin:
    """The coordinator's side of init's rendezvous. Needs `gens`, `_send`, `no_init`,
    `measure_compute`, and `never_joins` (ranks whose launched process ended: they will join
    no generation)."""

    gens: list[Any]
    _send: Any
    _skip: Any
    measure_compute: bool
    never_joins: Callable[[], set[int]] = set  # `serve`'s `ended`: ranks whose launched process ended
    no_init: dict[int, dict[str, Any]]  # rank -> how its process ended without calling init
    spawn_left: list[dict[str, Any]]  # mp.spawn's children that ended without calling init (`initwatch`)

    def _never_came(self, h: dict[str, Any]) -> None:
        """A torchrun-style rank's process ends before it called init (`rank.exits`): how and
        where; or a child mp.spawn started (`spawn`: its index, which rank it would have been
        is the script's business) did."""
        if h.get("rank") is None:
            self.spawn_left.append({"pid": h.get("pid"), "spawn": h.get("spawn"), "never": dict(h["never"])})
            return
        self.no_init.setdefault(int(h["rank"]), dict(h["never"]))

    def _starting(self) -> bool:
        """Start-up, which the watchdog does not count: no rank yet, or the latest generation
        still waiting for ranks (importing torch on a busy host takes long)."""
        return not self.gens or not self.gens[-1].complete()

    def _init_timeouts(self) -> None:
        """First inits whose deadline passed on the wall clock end with the store's error now,
        whatever their peers do meanwhile (compute before their own init, poll for a file):
        real Gloo's store wait raises at its entry + T. (Later inits, on the simulated clocks,
        end at a late peer's arrival, `_arrive`, or once nothing can progress, `_init_deadlines`.)"""
        now = time.time()
        for gen in self.gens:  # (torch's default too: a script that starts its own ranks has nothing else end it)
            for c, f in _timed_waits(gen, self._default_timeout_s()):
                w = c.init_wait
                if w is not None and w.at is not None and now - w.at > f.after:
                    self._init_failed(c, gen, f)

    def _arrive(self, conn: RankConn, gen: Any, h: dict[str, Any]) -> None:
        """`conn` joined `gen` (its membership is made): it waits until the world is complete,
        or answers at once the rank that comes after a peer's init timed out."""
        host = h.get("host")
        new = conn.init_wait = InitWait(int(h["req"]), time.time(), None if h.get("at") is None else float(h["at"]),
                                        conn.clock, None if h.get("to") is None else float(h["to"]),
                                        list(h.get("frames") or []), None if host is None else (str(host[0]), int(host[1])),
                                        h.get("p"))
        gen.entered[conn.rank] = new
        for c, f in _timed_waits(gen):  # those whose deadline passed before this arrival
            if c is not conn and c.init_wait is not None and f.after < gap(c.init_wait, new):
                self._init_failed(c, gen, f)
        if not gen.complete():
            return
        waiting = [c for c in gen.by_rank.values() if c.init_wait is not None]
        if gen.failed and all(f.posted for f in gen.failed):
            # every address is there, but a peer's is that of a process that left
            gone = gen.failed[0].rank
            for c in waiting:  # each fails as it comes: its clock is its entry's, late as it was
                c.clock = max(c.clock, entered_at(gen, int(c.rank)) or 0.0)  # type: ignore[arg-type]
                self._answer(c, gen, ("RuntimeError", f"{REFUSED} (rank {gone} timed out in init_process_group)"))
            return
        if gen.failed:  # rank 0's store lacks a client that gave up (or is gone): the waits end by their deadlines
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

    def _init_failed(self, conn: RankConn, gen: Any, f: Failure) -> None:
        """`conn`'s init ends with the rendezvous' error `f` (`fate`) at its deadline."""
        w = conn.init_wait
        assert w is not None
        conn.clock = w.clock + f.after
        self._skip(conn, waited_to(w.proc, w.clock, conn.clock), at=conn.clock)  # (its clocks read the wait, as on Gloo; before the answer)
        f.rank, f.frames = int(conn.rank), w.frames  # type: ignore[arg-type]
        gen.failed.append(f)
        self._answer(conn, gen, f.error)

    def _unjoinable(self, gen: Any) -> bool:
        """`gen` lacks ranks that cannot come now: their launched processes ended, or the
        process is blocked in an earlier generation (a hang there, if every rank is blocked)."""
        missing = [r for r in range(gen.world_size) if r not in gen.by_rank]
        gone = self.never_joins() if missing else set()
        return bool(missing) and all(r in gone or _blocked_elsewhere(self.gens, r, gen) for r in missing)

    def _init_deadlines(self) -> list[Deadline]:
        """In a generation whose missing ranks will never come (or whose store lost a rank
        that timed out), the inits with a timeout: each ends with the rendezvous' error at its
        deadline, in its turn among every kind (`expiry.GlooTimeoutsMixin._expire_next`); the
        rest wait (a hang)."""
        return [Deadline(c.init_wait.clock + f.after, int(c.rank), INIT, c, (c, gen, f), self._fire_inits)
                for gen in self.gens if (gen.failed and gen.complete()) or self._unjoinable(gen)
                for c, f in _timed_waits(gen)]

    def _fire_inits(self, due: list[tuple[RankConn, Any, Failure]]) -> None:
        """Their turn came first (`deadlines.next_due`): these inits end with the rendezvous' error."""
        for c, gen, f in due:
            self._init_failed(c, gen, f)

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
                why += "".join(f"; {left_words(x)}" for x in self.spawn_left)
                notes.append(f"init: rank(s) {waiting} wait in init_process_group for the whole world of "
                             f"{gen.world_size} (real Gloo's store rendezvous): {why}")
            notes.extend(f"init: rank {f.rank}'s init_process_group {f.why}" for f in gen.failed)
        return notes

    def _default_timeout_s(self) -> float:
        """torch's init timeout for the run's backend where the script gives none."""
        return DEFAULT_TIMEOUT_S.get(getattr(self, "backend", None) or "gloo", DEFAULT_TIMEOUT_S["gloo"])

    def default_timeouts(self) -> list[str]:
        """What the inits left waiting without a timeout would raise on real torch at its
        default deadline (30 min for Gloo, 10 min for NCCL): a run that ends as a hang there
        is one for half an hour, then each rank raises the rendezvous' error. The simulator
        keeps the hang (the program cannot progress) and says when and how it would end."""
        default_s = self._default_timeout_s()
        notes = []
        for gen in self.gens:
            for c in sorted(gen.by_rank.values(), key=lambda c: c.rank):
                w = c.init_wait
                f = fate(gen, c.rank, default_s) if w is not None and w.limit_s is None else None
                if f is not None:
                    kind, message = f.error
                    notes.append(f"init: on real torch rank {c.rank}'s wait ends after its default timeout "
                                 f"({default_s / 60:g} min): {kind}: {message}")
        return notes
