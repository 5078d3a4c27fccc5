"""What the simulated report's race notes read of the coordinator: how a failed rank's
process ended (`tore_down`, `lost_after_teardown`: torchrun's agent race, `simdist.agent_race`),
which ranks ended with an error as `mp.spawn`'s children (`spawned_failures`), and the notes
of the races read from the ranks' results once built (`race_notes`: a reset race,
`simdist.closure_races`; a spawn race, `simdist.spawn_race`; the connect race in init,
`simdist.init_race`; torchrun's stale-address race, `simdist.script.stale_race`).

Why a module of its own: the report's build (`simdist.script.build`) is at the house limit on
a module's size; these read the coordinator's generations and the race modules only.
"""

from __future__ import annotations

from collections.abc import Sequence

from simdist.closure_races import reset_race_notes
from simdist.init_race import init_race_notes
from simdist.race_walk import lost_peer
from simdist.report import RankResult
from simdist.script.coordinator import Coordinator
from simdist.script.generations import latest
from simdist.script.stale_race import stale_address_notes
from simdist.spawn_race import spawn_race_notes


def tore_down(coord: Coordinator, rank: int) -> bool:
    """Whether a failed rank's process tore its interpreter down before it ended (an exception,
    `sys.exit`), by what it told (of its group, or before its init): not after `os._exit`, nor
    when it told nothing (killed by a signal)."""
    conn = latest(coord.gens, rank)
    x = conn.exit if conn is not None else coord.no_init.get(rank)
    return x is not None and x.get("how") != "os._exit"


def lost_after_teardown(coord: Coordinator, r: RankResult, first: int, failed: dict[int, float]) -> int | None:
    """The rank whose process's end failed `r`, when it is a failed rank other than `first`
    that tore its interpreter down: on real Gloo `r` lost it only after that teardown
    (`TEARDOWN_MIN_S` to seconds), while the agent's SIGTERM comes a poll after `first`'s
    end, so either may come first (examples/monitored_barrier_straggler.py: rank 1 lost rank 0
    in 1 real torchrun run of 6, was SIGTERMed in 5). None: no such rank."""
    peer = lost_peer(r)
    return peer if peer is not None and peer != first and peer in failed and tore_down(coord, peer) else None


def spawned_failures(coord: Coordinator) -> frozenset[int]:
    """The ranks whose process told it ended with an error (an exception, a non-zero exit) as a
    child of `torch.multiprocessing.spawn` (its `_wrap`: `rank.exits` notes the child's index):
    its parent then SIGTERMs the others (`simdist.spawn_race`). And a child killed by a signal
    (SIGKILL, SIGSEGV: no exit told; it said at init it is mp.spawn's), when its process was
    the first of such silent ones to end and ended before any told failure: its parent sees the
    signal's exit code and SIGTERMs the others just the same. The later silent ones are those
    SIGTERMs' victims (tests/scripts/selfkill_spawn.py)."""
    out, told, silent = set(), [], []
    for g in coord.gens:
        for rank, conn in g.by_rank.items():
            x = conn.exit or {}
            if x.get("spawn") is not None and (x.get("error") or x.get("code")):
                out.add(rank)
                told.append(conn.exit_at if conn.exit_at is not None else float("inf"))
            elif conn.exit is None and conn.spawn is not None and conn.ended_at is not None:
                silent.append((conn.ended_at, rank))
    first = min(silent, default=None)
    if first is not None and first[0] < min(told, default=float("inf")):
        out.add(first[1])
    return frozenset(out)


def race_notes(coord: Coordinator, ranks: Sequence[RankResult]) -> list[str]:
    """The simulated report's notes of the races read from its ranks' results: reset races,
    spawn races, init connect races, then torchrun's stale-address race of a later generation
    (`simdist.script.stale_race`: named, never accepted by `compare`)."""
    return (reset_race_notes(ranks) + spawn_race_notes(ranks, spawned_failures(coord))
            + init_race_notes(ranks, len(coord.gens)) + stale_address_notes(coord.gens))
