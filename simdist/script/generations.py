"""Generations of ranks: the lives of a script's default process group, one engine each.

A generation is one life of the default process group, from `init_process_group` to
`destroy_process_group` (or its process's exit). The DDP tutorial starts two (`mp.spawn`
twice: new processes initialise ranks 0 and 1 again); a torchrun-style script may destroy
its group and initialise again in the same process. Each generation is a world of its own
on real Gloo: its ranks meet afresh at the store, its groups' sequence numbers start at 1,
and no operation of one pairs with one of another. So each gets its own engine and
timeline, and its groups are named with its number (`env.group_name`: `gen2/WORLD`) on
both sides, which keeps every (group, seq) key of the merged report apart and lets
`compare` match generation to generation.

Which generation an `init_process_group` joins (`joining`): the oldest one still waiting
for ranks that has not got this rank yet; otherwise it starts the next one. A generation's
world size is its first rank's, so a later one may be larger or smaller. A rank starts a
new generation only once its previous one has ended for it (destroyed, or its process
exited): two live processes claiming one rank are still an error.
"""

from __future__ import annotations

import selectors
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simdist.engine.core import Engine
from simdist.errors import SimdistError
from simdist.limits import LOCAL_RANKS
from simdist.race_walk import PEER_GONE
from simdist.script import env
from simdist.script.ranks import RankConn, Timeline, ZeroCost, first_user


@dataclass(eq=False)  # one identity each: keyed by (`expiry`), never compared by value
class Generation:
    """One life of the default process group: its number (1 first), its world, its engine
    and timeline, and the membership (`RankConn`) of each rank that joined it."""

    index: int
    world_size: int
    engine: Engine
    timeline: Timeline
    by_rank: dict[int, RankConn] = field(default_factory=dict)
    # each rank's entry to init (`rendezvous.InitWait`), kept after it was answered: its peers' deadlines use it
    entered: dict[int, Any] = field(default_factory=dict)
    # inits that ended with the rendezvous' error (`rendezvous.Failure`)
    failed: list[Any] = field(default_factory=list)
    # store-based barriers under way (TORCH_DIST_INIT_BARRIER=1): key -> rank -> `barriers.BarrierWait`
    barriers: dict[str, dict[int, Any]] = field(default_factory=dict)
    # its ranks' init made a store of their own (rank 0 hosts one: env:// or tcp:// without torchrun's
    # agent; or rank 0 made its own server at MASTER_PORT and gave it to init, `ownstore.hosts_own`), whose keys are the generation's only; else they meet at the agent's, whose keys every
    # such generation shares (`keystore.KeyStoreMixin._kv_space`)
    hosted: bool = False

    def complete(self) -> bool:
        """Every rank of its world has joined (before that, a missing rank may still come)."""
        return len(self.by_rank) >= self.world_size

    def world(self) -> str:
        return env.group_name("0", True, self.index)

    def lost_at(self, message: str) -> float | None:
        """When a wait that failed with a peer's closure (`message`, the simulator's words)
        ended on the simulated clock: when the peer exited or timed out (its clock), not the
        waiter's last issue; what the waiter does after it comes no earlier (the lines
        `build._agent_on_clock` keeps up to the agent's instant). None: no peer's closure."""
        m = PEER_GONE.search(message)
        peer = self.by_rank.get(int(m.group(1))) if m is not None else None
        return peer.clock if peer is not None else None


def new_generation(index: int, size: int, backend: str, cost: Callable[[int], Any]) -> Generation:
    """A generation of `size` ranks; `cost(size)` is its timeline's cost model (it may raise
    for a topology that cannot hold the world: the caller reports that as bad input)."""
    world = env.group_name("0", True, index)
    engine = Engine(size, {world: list(range(size))}, ZeroCost(), backend)
    return Generation(index, size, engine, Timeline(cost(size)))


def joining(gens: list[Generation], rank: int) -> Generation | None:
    """The generation an init of `rank` joins; None: it starts a new one."""
    return next((g for g in gens if not g.complete() and rank not in g.by_rank), None)


def latest(gens: list[Generation], rank: int) -> RankConn | None:
    """`rank`'s membership in the latest generation it joined."""
    return next((g.by_rank[rank] for g in reversed(gens) if rank in g.by_rank), None)


def memberships(gens: list[Generation], rank: int) -> list[RankConn]:
    """`rank`'s memberships, oldest generation first."""
    return [g.by_rank[rank] for g in gens if rank in g.by_rank]


def merged_groups(gens: list[Generation]) -> dict[str, list[int]]:
    """Every generation's groups under their report names (distinct by the generation prefix)."""
    return {name: list(members) for g in gens for name, members in g.engine.groups.items()}


def summary(gens: list[Generation]) -> str | None:
    """The report's note on generations, when there was more than one."""
    if len(gens) < 2:
        return None
    parts = []
    for g in gens:
        missing = [r for r in range(g.world_size) if r not in g.by_rank]
        gap = f", ranks {missing} never joined" if missing else ""
        parts.append(f"{g.index}: {g.world_size} ranks{gap}")
    stale = ("; under torchrun a later generation meets at the agent's store, which still holds the earlier one's "
             "Gloo addresses under the names it rewrites: each rank and group at risk has its \"torchrun stale-address "
             "race\" note (`simdist.script.stale_race`); simdist models each generation meeting its own"
             if any(g.index > 1 and not g.hosted for g in gens) else "")
    return (f"generations: the default process group was initialised {len(gens)} times ({'; '.join(parts)}); "
            f"the operations of generation k > 1 are in groups named gen<k>/... (gen2/WORLD){stale}")


def semantics_of(requested: str) -> str:
    """The backend whose semantics a run gets from what the script asked for."""
    return "nccl" if "nccl" in requested.lower() else "gloo"


class GenerationsMixin:
    """The coordinator's side of generations: a rank's `init_process_group` joins one (or
    starts the next), `destroy_process_group` ends its membership, and a process that
    initialises again carries on in a new membership. A mixin, as `expiry`'s, because each
    step reads and moves the coordinator's connections, engines and bad-input state.
    Needs: `gens`, `conns`, `sel`, `backend`, `batches`, `input_error`, `protocol_errors`,
    `requested`, `measure_compute`, `cost_factory`, `rendezvous` (the simulated init waits for
    the world: `simdist.script.rendezvous`), `_arrive`, `_send`, `_overdue`, `_pump`."""

    gens: list[Generation]
    conns: list[RankConn]
    sel: selectors.BaseSelector
    backend: str | None
    batches: list[int]
    input_error: str | None
    protocol_errors: list[str]
    requested: list[str]
    measure_compute: bool
    cost_factory: Any
    rendezvous: bool
    _arrive: Any
    _never_came: Any
    _send: Any
    _overdue: Any
    _pump: Any

    def _init(self, conn: RankConn, h: dict[str, Any]) -> None:
        if "never" in h:  # its process ends without an init: how (`rendezvous`)
            return self._never_came(h)
        rank, size = int(h["rank"]), int(h["world_size"])
        conn.advance(h, self.measure_compute)  # its clock starts here: compute is measured from now
        fresh = conn.rank is None
        error, gen = self._join(conn, rank, size, str(h.get("backend") or ""))
        if error is None and not fresh:  # the same process again, after destroy_process_group: a new membership
            conn = self._next_membership(conn)  # (a refused init keeps the old one: the rank's error is its)
        if error is None:
            if fresh:  # a new process of a later generation (mp.spawn again) starts where the earlier ones ended
                conn.clock = max([c.clock for g in self.gens[:gen.index - 1] for c in g.by_rank.values()  # type: ignore[union-attr]
                                  if not c.active() or c.exit is not None], default=0.0)
            conn.rank, conn.pid, conn.gen = rank, h.get("pid"), gen
            conn.spawn = h.get("spawn")
            gen.hosted = gen.hosted if gen.by_rank else h.get("host") is not None or bool(h.get("own"))  # type: ignore[union-attr]
            gen.by_rank[rank] = conn  # type: ignore[union-attr]
            self.requested.append(str(h.get("backend")))
        else:
            self.protocol_errors.append(error)
        if error is None and self.rendezvous:  # answered once the whole world has joined (`rendezvous`)
            self._arrive(conn, gen, h)
            return
        self._send(conn, {"t": "reply", "req": h["req"], "error": error, "backend": self.backend,
                          "gen": gen.index if gen is not None else None})

    def _join(self, conn: RankConn, rank: int, size: int, requested: str) -> tuple[str | None, Generation | None]:
        """The generation `rank` joins (`generations.joining`: made here when it starts one), or
        why it cannot; bad input that only the ranks can tell is kept in `input_error`."""
        if not self.gens and self.backend is None:
            self.backend = semantics_of(requested)
        if not 0 <= rank < size:  # before a generation is made: one with no member would wait for good
            return f"rank {rank} is out of range for world_size={size}", None
        gen = joining(self.gens, rank)
        if gen is None:
            prev = latest(self.gens, rank)
            if prev is not None and prev is not conn and prev.active() and prev.exit is None:
                return f"two processes initialised as rank {rank}", None
            gen = self._new_generation(size)
        if self.input_error is not None:
            return self.input_error, None
        if len(self.batches) > 1 and len(self.batches) != size:
            self.input_error = (f"batches: {len(self.batches)} caps given ({','.join(map(str, self.batches))}) "
                                f"for a world of {size} ranks (give one per rank, or one for every rank)")
            return self.input_error, None
        if size != gen.world_size:
            return f"rank {rank} initialised with world_size={size}, other ranks with {gen.world_size}", None
        return None, gen

    def _new_generation(self, size: int) -> Generation:
        """The next generation, of `size` ranks (its first rank's world size)."""
        try:  # a script that starts its own ranks (mp.spawn) is capped here, at its first rank
            LOCAL_RANKS.check(size, "script", f"world_size={size:,} rank processes")
        except SimdistError as e:
            self.input_error = self.input_error or str(e)
            size = 1
        try:
            gen = new_generation(len(self.gens) + 1, size, self.backend or "gloo", self.cost_factory)
        except SimdistError as e:  # a topology that cannot hold this world: bad input
            self.input_error = self.input_error or str(e)
            gen = new_generation(len(self.gens) + 1, size, self.backend or "gloo", lambda _n: ZeroCost())
        self.gens.append(gen)
        return gen

    def _next_membership(self, old: RankConn) -> RankConn:
        """A process initialises its default group again: the membership it had ends as a
        normal destroy (if the destroy was not reported, as it ends at an exit), and a new one
        carries on its connection, clock and compute measure."""
        new = RankConn(old.sock, old.decoder, clock=old.clock, cpu_marks=dict(old.cpu_marks), claim=old.claim)
        if not old.destroyed:
            self._destroyed(old, {})
        if old.exit is None:
            where = first_user(old.destroy_frames)
            old.exit = {"how": "destroyed", "where": where}
        old.connected, old.ended_at = False, time.time()
        self.conns.append(new)
        self.sel.modify(old.sock, selectors.EVENT_READ, new)
        return new

    def _destroyed(self, conn: RankConn, h: dict[str, Any]) -> None:
        """The rank destroyed its default group: it leaves its generation (on Gloo its pairs
        close, failing what its peers still need from it, as at an exit)."""
        if conn.rank is None or conn.destroyed or conn.gen is None:
            return
        conn.advance(h, self.measure_compute)
        conn.destroyed, conn.destroy_frames = True, list(h.get("frames") or [])
        conn.block = None
        self._overdue(conn)
        if self.backend == "gloo":
            conn.gen.engine.rank_gone(conn.rank, abrupt=False, at=conn.clock)
        self._pump()

