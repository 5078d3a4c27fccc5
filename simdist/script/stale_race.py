"""Torchrun's stale-address race of a later generation: the simulated report's note, rank by
rank and group by group (`stale_address_notes`, `noted_stale_address_races`).

Under torchrun every init of a process, the first and one after `destroy_process_group`, meets
at the agent's one TCPStore, and torch names each generation's groups alike (destroy resets the
count: the world is "0" again, the first `new_group` "1"). Gloo's rendezvous of a group posts
each member's listening address under the group's name and its group rank, and reads its
peers' there; a key an earlier generation's same-named group posted is still there until the
peer rewrites it. A rank that reads a peer's address before the peer rewrote it connects to a
listener that is gone ("Connection refused") or still the earlier group's ("Connection reset
by peer"), or waits for a connection that never comes (a hang). Measured under plain `torchrun
--standalone` (torch 2.13): `examples/reinit_same_process.py`, 3 ranks, 3 of 6 runs completed,
1 "Connection reset by peer", 2 hung; `tests/scripts/store_generations.py reinit`, 2 and 3
ranks, 0 of 6 completed (docs/script-backend.md, "Generations of ranks").

The decision: a race of the user's plain torchrun, so the simulated report names it on every
rank and group it can hit, with what that rank may meet there; but not a race that `compare`
accepts. simdist's real side keeps each generation's addresses apart (`rank.genkeys`), so its
runs never read a stale address: a real run of simdist that failed so would be a fault of
that isolation, and stays a difference. Not at risk: a group whose name no earlier generation
used, a peer whose group rank had no address in the earlier same-named group, and a
generation whose store was its own (rank 0 hosts one each init: `Generation.hosted`), as with
`mp.spawn` and env://.
"""

from __future__ import annotations

import re
from typing import Any

from simdist.script.env import GENERATION_PREFIX, generation_of

_NOTE = re.compile(r"^rank (\d+): torchrun stale-address race: in generation (\d+), (\S+) reads")


def _base(name: str) -> str:
    """A group's name as torch gives it in every generation (the report's `gen<k>/` prefix off)."""
    k = generation_of(name)
    return name.removeprefix(GENERATION_PREFIX.format(k)) if k > 1 else name


def stale_address_notes(gens: list[Any]) -> list[str]:
    """The note of each (rank, group) of a later generation that meets at torchrun's agent's
    store (not `hosted`) where an earlier such generation left a same-named group's addresses
    of a peer's group rank (`gens`: the coordinator's `generations.Generation`s, oldest first)."""
    notes = []
    for g in gens:
        if g.index < 2 or g.hosted:
            continue
        earlier: dict[str, tuple[int, int]] = {}  # a group's torch name -> (the latest earlier generation, its size)
        for e in gens:
            if e.index < g.index and not e.hosted:
                earlier.update({_base(n): (e.index, len(m)) for n, m in e.engine.groups.items()})
        for name, members in sorted(g.engine.groups.items()):
            if (old := earlier.get(_base(name))) is None:
                continue
            for i, rank in enumerate(members):
                peers = [p for j, p in enumerate(members) if j != i and j < old[1]]
                if peers:
                    notes.append(stale_address_note(rank, g.index, name, old[0], peers))
    return notes


def stale_address_note(rank: int, generation: int, group: str, old: int, peers: list[int]) -> str:
    """The simulated report's note for rank `rank`, whose group `group` of generation
    `generation` reads peers `peers`' Gloo addresses under the names generation `old`'s
    same-named group posted theirs."""
    return (f"rank {rank}: torchrun stale-address race: in generation {generation}, {group} reads the Gloo addresses "
            f"of ranks {peers} at torchrun's agent store under the names generation {old}'s same-named group left "
            f"theirs; under plain torchrun this rank may read one before that peer rewrote it and fail creating the "
            f"group (\"Connection refused\", or \"Connection reset by peer\") or hang there, whichever rewrote first "
            f"(measured: 3 of 6 and 0 of 6 runs completed, docs/script-backend.md, \"Generations of ranks\"); the "
            f"simulator and simdist's real side meet each generation's own addresses (rank.genkeys), so compare "
            f"never shows it")


def noted_stale_address_races(report: Any) -> dict[int, list[tuple[int, str]]]:
    """The ranks the notes put in torchrun's stale-address race: rank -> [(generation, group)]."""
    out: dict[int, list[tuple[int, str]]] = {}
    for m in map(_NOTE.match, report.notes):
        if m:
            out.setdefault(int(m.group(1)), []).append((int(m.group(2)), m.group(3)))
    return out
