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

from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simdist.engine.core import Engine
from simdist.script import env
from simdist.script.ranks import RankConn, Timeline, ZeroCost


@dataclass
class Generation:
    """One life of the default process group: its number (1 first), its world, its engine
    and timeline, and the membership (`RankConn`) of each rank that joined it."""

    index: int
    world_size: int
    engine: Engine
    timeline: Timeline
    by_rank: dict[int, RankConn] = field(default_factory=dict)

    def complete(self) -> bool:
        """Every rank of its world has joined (before that, a missing rank may still come)."""
        return len(self.by_rank) >= self.world_size

    def world(self) -> str:
        return env.group_name("0", True, self.index)


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
    return (f"generations: the default process group was initialised {len(gens)} times ({'; '.join(parts)}); "
            f"the operations of generation k > 1 are in groups named gen<k>/... (gen2/WORLD)")
