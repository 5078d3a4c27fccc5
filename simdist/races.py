"""Races of real processes that make a real Gloo run differ from the simulated one without
a fault of the model: `named_races` names them, so that `simdist compare` says "agree up to a
race of the real run" (exit code 4, `simdist.cli.console.ExitCode.RACE`) instead of a model
difference, and the sweeps (bench/script_sweep.py, bench/race_tally.py) count them apart,
never as agreement.

Each race is named only when it explains every difference of the comparison; anything left
over makes all of it a difference. The kinds, each with its measurements:

A peer's teardown. A rank whose script raises or exits closes its Gloo sockets only once its process
is gone; its peers blocked on a message with it fail then ("Connection closed by peer").
The simulator, which models no teardown, has them fail at the instant it raised (with
`--zero-compute`). On real Gloo the teardown is CPU work (the traceback, exit handlers, the
launcher's flush of open files, freeing the process) whose wall time depends on the load:
measured with `simdist real` on this 2-core host under load ~8 (one rank raises, its peer is
blocked in a `recv` from it), the peer failed 0.69-1.51 s after the raise (6 runs) on the
launcher as it was, 0.22-0.73 s once the exit's scan for open files was made cheap, and
0.16-0.25 s once the fork server froze what it imported (`simdist.script.rank.zygote`). A
peer whose own Gloo timeout is due within that time of the exit times out on real Gloo in
some runs and loses its peer in others; a chain of exits (a rank that failed because of one
exit exits in turn) adds up. Same script, same machine: either outcome.

So a rank is an exit race (`ExitRace`, `exit_races`) when the simulator has it lose a peer that exited, real Gloo has it
time out, and its own deadline came at most `EXIT_RACE_S` after the simulated exit: on real
Gloo the exit had not reached it yet.

A second race: a group's connection (`ConnectRace`, `connect_races`). Gloo connects a group's pairs in
`new_group` / `init_process_group` (connectFullMesh); each rank returns once ITS side of
each pair is connected, not its peers'. A rank whose process is descheduled in there (a
loaded host) can still be connecting when a faster peer has returned, run its first
collective and exited: that peer's closed socket fails the slow rank's `new_group` ("Gloo
connectFullMesh failed with ... Connection closed by peer"), and the slow rank's exit in
turn fails its partners' operations that had a message pending with it, before their own
timeout or completion. The simulator connects a group at once (it gives what an unloaded
host gives). Measured with `tests/scripts/timed_out_root_fed.py` (`bench/race_tally.py`):
1 real run in 235 on this 2-core host (1 of 60 beside the example tests' real runs, 0 of 80
in a second such run, 0 of 60 beside other load, 0 of 30 with 4 CPU burners on the ranks'
core, 0 of 5 quiet), the shape of its failure in a two-worker CI run; on raw Gloo with the
slow rank stopped inside `new_group` (SIGSTOP) until the fast one exited, 3 of 10 runs
(`bench/gloo_closed_pair_probe.py connect_race`): where the process stops decides. The same
in `init_process_group`: `tests/scripts/pg_timeouts.py --case monitored_sub` (3 ranks; rank
0 has nothing to do after init and returns at once) had rank 1 fail connecting init's full
mesh with rank 0's closure in 2 of 25 real runs beside 4 CPU burners (0 of 25 in a second
tally, once in a CI run), and rank 2, which never got to anything it does with rank 1, wait
for it in `new_group([1, 2])` until the watchdog: a partner of a racer may also be one that
waited outside any operation (its trace a beginning of the simulated rank's, none pending)
and hung or failed there (`ConnectRace.waited`); kept as `tests/data/races/`.

A third race, of the rendezvous (`simdist.script.rendezvous`): a rank that comes to
`init_process_group` after its peers' init timed out and their processes left finds their
addresses at the store and fails to connect the full mesh, after its own timeout, in one of
two ways by which side of each Gloo pair opens the connection (decided by the pair's two
listening addresses, ports the kernel picks at random): it connects to a listener that is
gone ("... SO_ERROR: Connection refused") or it waits for a peer to connect to it
("... Connect timeout [none]"); both measured with the same script, `tests/scripts/
init_waits_for_world.py sleeps2 0.5`. The simulator says the first (`RendezvousRace`, `rendezvous_races`).

A fourth race, of a collective's teardown (`TeardownRace`, `teardown_races`): a rank posts a
collective and its process ends right after (it exits without waiting on it, or fails in it on
a member that had left, after posting its messages to the others). A Gloo send of an unbound
buffer is written only once its receiver's "ready" notice has come (gloo/transport/tcp/pair.cc,
`Pair::send`: `localPendingSend_`), and the rank's messages move only while its process is
up, so a peer whose notice or whose own send comes after the leaver's sockets closed loses it
("Connection closed by peer"), one before completes. The simulator has every message of a
collective posted before the exit move (`Engine.rank_gone`: the unloaded host's outcome).
Measured with `tests/scripts/rooted_root_exits.py OP SHAPE` (root 0; `python bench/race_tally.py
tests/scripts/rooted_root_exits.py --nproc N --n 20 -- OP SHAPE`, this 2-core host beside the
other helpers' runs, load 8-23), the real runs in which every live rank completes, as
simulated, against those in which some lost the leaver or a rank that had lost it:
`async` (the root exits without waiting): broadcast 13/7 (2 ranks), 7/13 (3), 10/10 (4);
scatter 9/11, 4/16, 9/11; gather 18/2, 16/4, 12/8; reduce 7/13, 5/15, 2/18; all_reduce 2/18
(3 ranks; one of those with a rank timing out, left a difference); scatter at 2 ranks beside
2 CPU burners 10/10. `gone` (the last rank's
process has ended; the root fails as it posts to it) and `fails` (it is still unwinding):
the scatter's leaf lost the root in 1 run of 20 for each at 3 ranks; broadcast and gather
0 of 20 each at 3 ranks (scatter and broadcast 0 of 20 beside 2 CPU burners), and all four
ops 0 of 20 at 4 ranks (reduce: every live rank fails,
as simulated: its ring needs the gone rank). Both outcomes of one program: a race. Named only
for that shape: a collective the leavers ended with, unfinished on real Gloo (not waited for, or
failed in with Gloo's error), their processes ending within `EXIT_RACE_S` of the losing rank's
post on the simulated clocks (`_left_with`).

A fifth race, of a send's bytes (`SendBandRace`, `send_band_races`): a rank sends to a peer
that posted its receive and then ended. Gloo writes the send once the receiver's notice came
(a non-blocking `writev`); the send completes once every byte is in the kernel's socket, and
what the socket does not take waits in the pair's transmit queue, which the receiver's
closure does not reach for an unbound buffer (`Pair::signalException` looks at `op.buf`), so
the send then waits out its timeout. What the socket takes is the kernel's: a fresh loopback
connection here takes 3,919,467 bytes (`tests/test_send_band.py`'s `young_capacity`; tcp_wmem
max 4 MB, tcp_rmem max 32 MB), more once its traffic has grown the receive window, and a
receiver that dies while the sender copies resets the connection and cuts the copy short.
Measured with `tests/scripts/send_to_leaver.py BYTES posted kill|exit` (the receiver leaves by
`os._exit` or `sys.exit` right after its `irecv`; `python bench/race_tally.py
tests/scripts/send_to_leaver.py --nproc 2 --n 10 -- BYTES posted kill`), completed / timed
out, kill then exit: 1, 2, 3 MB 10/0 and 10/0 each (3 MB killed: 19/1 in a second tally of
20); 3.4 MB killed 20/0; 3.7 MB 9/1, 10/0; 3.9 MB 3/7, 8/2; 4 MB 1/9, 5/5; 5 MB
4/6, 5/5; 6 MB 1/9, 6/4; 7 MB 0/10, 3/7; 8 MB 0/10 (1/2 in a second tally), 3/7; 12 MB 0/10,
2/8; 16 MB 0/10, 0/10. No size above one copy's worth is safe, none below the ceiling is
certain to time out (a receiver that lives to read completes any size): the simulator
completes the send, and a real timeout of one longer than the kernel's default send buffer
(`whole_write`, read from `net.ipv4.tcp_wmem`), to a receiver that ended within `EXIT_RACE_S` of
the two posts on the simulated clocks (one that lived on read it), is named this race.

A sixth race, of torchrun's agent (`AgentRace`), is `simdist.agent_race`'s; a seventh and an
eighth, a peer's pair closure before a rank's own next event (a timeout's before a near
deadline, `TieRace`; an abort's reset before the read of its block, `ResetRace`),
`simdist.closure_races`'; a ninth, mp.spawn's SIGTERM against a failed child's closure
(`SpawnRace`), `simdist.spawn_race`'s; a tenth, the group-connection race in init where the
simulated report noted it, with a partner ended by torchrun's agent (`InitRace`),
`simdist.init_race`'s.

The per-rank walk the kinds share (which fields each rank differs in, whether a rank stopped
short, when it failed on the simulated clocks) is `simdist.race_walk`.
"""

from __future__ import annotations

import re
from dataclasses import asdict, dataclass
from typing import Any, ClassVar

from simdist.agent_race import AgentRace, agent_races
from simdist.closure_races import ResetRace, TieRace, reset_races, tie_races
from simdist.compare import Comparison
from simdist.init_race import InitRace, init_races
from simdist.race_walk import (
    CHAINED_FIELDS,
    CONNECT_CLOSED,
    GLOO_ERRORS,
    STOPPED_FIELDS,
    each_rank,
    every_differing_rank,
    failed_after_last,
    failed_at,
    fields_by_rank,
    stopped_short,
)
from simdist.report import RankResult, Report, TraceEntry
from simdist.socket_buffers import whole_write
from simdist.spawn_race import SpawnRace, spawn_races
from simdist.vocab import AGENT_TERMINATED, FULL_MESH, P2P_OPS, dtype_bytes

EXIT_RACE_S = 1.5  # the worst exit measured (1.51 s, before the fixes): a margin for load spikes and chains

_PEER_EXITED = re.compile(r"Connection (?:closed|reset) by peer \(rank (\d+) has exited\)")
_TIMED_OUT_IN = re.compile(r"timed out in (\w+)\)$")  # the simulator's refused connect names its peers' call
_TIMED_OUT = re.compile(r"Timed out waiting (\d+)ms")


@dataclass(frozen=True)
class ExitRace:
    """Rank `rank` lost peer `peer` in the simulator `gap_s` seconds before its own deadline,
    and timed out on real Gloo: the peer's teardown took longer than `gap_s` there."""

    kind: ClassVar[str] = "exit"

    rank: int
    peer: int
    gap_s: float

    def describe(self) -> str:
        return (f"rank {self.rank}: exit race, not a model difference: the simulator fails it as rank {self.peer} "
                f"exits, {self.gap_s:.2f} s before its own Gloo timeout; on real Gloo rank {self.peer}'s "
                f"teardown had not closed its sockets yet and the timeout came first")


@dataclass(frozen=True)
class RendezvousRace:
    """Rank `rank` came to a group's creation (`call`: init_process_group or new_group) after
    its peers' wait there timed out: refused in the simulator, a connect timeout on real Gloo
    (which side of a pair connects is the ports' draw)."""

    kind: ClassVar[str] = "rendezvous"

    rank: int
    call: str = "init_process_group"

    def describe(self) -> str:
        return (f"rank {self.rank}: rendezvous race, not a model difference: it came to {self.call} after its "
                f"peers' {self.call} timed out; whether Gloo's connect is refused or times out depends on which "
                f"side of each pair connects, decided by the ports")


def exit_races(sim: Report, real: Report, cmp: Comparison) -> list[ExitRace]:
    """The exit races that make up every difference of `cmp` (each an `error` of a rank, each
    such rank an `exit_race`); empty when the runs agree or anything else differs."""
    return each_rank(sim, real, cmp, (exit_race,))


def rendezvous_races(sim: Report, real: Report, cmp: Comparison) -> list[RendezvousRace]:
    """The rendezvous races that make up every difference of `cmp` (each an `error` of a rank,
    each such rank a `rendezvous_race`); empty when the runs agree or anything else differs."""
    return each_rank(sim, real, cmp, (rendezvous_race,))


def rendezvous_race(sim: Report, real: Report, rank: int) -> RendezvousRace | None:
    """Rank `rank`'s full-mesh connect (at init or new_group: the simulator's message says which
    call its peers timed out in) was refused in `sim` and timed out in `real`."""
    s, r = sim.ranks[rank].error, real.ranks[rank].error
    if s is None or r is None or not (s.message.startswith(FULL_MESH) and r.message.startswith(FULL_MESH)):
        return None
    if "Connection refused" not in s.message or "Connect timeout" not in r.message:
        return None
    call = _TIMED_OUT_IN.search(s.message)
    return RendezvousRace(rank, call.group(1)) if call else RendezvousRace(rank)


def exit_race(sim: Report, real: Report, rank: int) -> ExitRace | None:
    """Rank `rank` lost a peer that exited in `sim`, timed out in `real`, and its deadline
    (the operation it failed in, issued at `t_issue`, plus the timeout real Gloo names) came
    within `EXIT_RACE_S` of its simulated failure: the race; else None."""
    s, r = sim.ranks[rank], real.ranks[rank]
    if s.error is None or r.error is None or (s.error.category, r.error.category) != ("peer_lost", "timeout"):
        return None
    peer, waited = _PEER_EXITED.search(s.error.message), _TIMED_OUT.search(r.error.message)
    failed_in = next((e for e in reversed(s.trace) if not e.completed), None)
    if peer is None or waited is None or failed_in is None:
        return None
    gap = failed_in.t_issue + int(waited.group(1)) / 1000 - failed_at(dict(enumerate(sim.ranks)), rank)
    return ExitRace(rank, int(peer.group(1)), gap) if 0 <= gap <= EXIT_RACE_S else None


@dataclass(frozen=True)
class ConnectRace:
    """Real Gloo's rank `rank` failed connecting a group (a peer that had connected its side
    ran ahead and exited); `lost` are the ranks that then lost it, with their operations
    pending with it; `waited` those that waited for it outside any operation (in a group's
    connection it never came to), until they hung or failed. The simulator connects the
    group at once."""

    kind: ClassVar[str] = "connect"
    rank: int
    lost: tuple[int, ...]
    waited: tuple[int, ...] = ()

    def describe(self) -> str:
        lost = f"; ranks {list(self.lost)} then lost it" if self.lost else ""
        waited = (f"; ranks {list(self.waited)} waited for it outside any operation (a group's connection it "
                  f"never came to) and hung or failed there") if self.waited else ""
        return (f"rank {self.rank}: group-connection race, not a model difference: on real Gloo its process was "
                f"still connecting a group (init_process_group or new_group: Gloo's connectFullMesh) when a peer "
                f"that had connected its side ran on and exited, and it failed with that peer's closure"
                f"{lost}{waited}; the simulator connects a group at once")


def connect_races(sim: Report, real: Report, cmp: Comparison) -> list[ConnectRace]:
    """The group-connection races that make up every difference of `cmp` (the module's
    docstring). Racers: real ranks that failed in Gloo's connectFullMesh with a peer's closure,
    having done and printed only what the simulator has them do first. Their partners, each
    on real Gloo only: lost a peer (`_lost_it`), or waited for a racer outside any operation
    and hung or failed there (`_waited_for_it`). Empty when the runs agree or any difference
    is something else: then all of it counts as a difference."""
    sims, reals = {r.rank: r for r in sim.ranks}, {r.rank: r for r in real.ranks}
    racers = [r.rank for r in real.ranks if r.error is not None and r.error.category == "peer_lost"
              and CONNECT_CLOSED.search(r.error.message) and r.rank in sims and stopped_short(sims[r.rank], r)]
    if cmp.agree or not racers:
        return []
    if (fields := fields_by_rank(real, cmp)) is None:
        return []
    lost, waited = [], []
    for rank, differ in sorted(fields.items()):
        if rank in racers:
            continue
        if _lost_it(reals[rank], differ):
            lost.append(rank)
        elif _waited_for_it(sims[rank], reals[rank], differ):
            waited.append(rank)
        else:
            return []
    return [ConnectRace(r, tuple(lost), tuple(waited)) for r in racers]


def _lost_it(real: RankResult, differ: set[str]) -> bool:
    """A partner that lost a peer with an operation pending with it: the same operations, the
    same end; only how it failed (status, error, printed lines) differs."""
    return differ <= CHAINED_FIELDS and real.error is not None and real.error.category == "peer_lost"


def _waited_for_it(sim: RankResult, real: RankResult, differ: set[str]) -> bool:
    """A partner that, on real Gloo, stopped short where the simulator went on: it hung, or
    failed by a timeout or a lost peer, with no operation of its trace pending (it waited
    outside any collective: a group's connection that the racer, gone, never came to), having
    done and printed only what the simulator has it do first. A partner that did or printed
    anything else, or waited in an operation, is a difference."""
    ended = real.status == "hang" and real.error is None or (
        real.status == "error" and real.error is not None and real.error.category in GLOO_ERRORS)
    return (differ <= STOPPED_FIELDS and ended and real.blocked_in is None
            and all(e.completed for e in real.trace) and stopped_short(sim, real))


@dataclass(frozen=True)
class TeardownRace:
    """On real Gloo, rank `rank` lost collective #`seq` (`op`) on `group`, which the ranks
    `left` had posted and then ended with (it was their last: they exited without waiting on
    it, or failed in it); the simulator completes it for `rank` (the module's docstring)."""

    kind: ClassVar[str] = "teardown"
    rank: int
    op: str
    seq: int
    group: str
    left: tuple[int, ...]

    def describe(self) -> str:
        return (f"rank {self.rank}: teardown race, not a model difference: ranks {list(self.left)} posted "
                f"#{self.seq} {self.op} on {self.group} and ended right after; on real Gloo their sockets closed "
                f"before this rank's messages with them had moved (a Gloo send waits for its receiver's "
                f"notice), so it lost them; the simulator has their messages move while they unwind")


def teardown_races(sim: Report, real: Report, cmp: Comparison) -> list[TeardownRace]:
    """The teardown races that make up every difference of `cmp` (the module's docstring): each
    differing rank lost, on real Gloo only, a collective that others posted and ended with
    (`_lost_to_a_leaver`); a difference of no rank may only be the run's outcome, an error on
    real Gloo. Empty when the runs agree or anything else differs."""
    return every_differing_rank(sim, real, cmp, _lost_to_a_leaver)


def _lost_to_a_leaver(sims: dict[int, RankResult], reals: dict[int, RankResult], rank: int,
                      differ: set[str]) -> TeardownRace | None:
    """Rank `rank` failed on real Gloo with a lost peer after its last operation, which the
    simulator completes, having done and printed only what the simulator has it do first;
    and ranks that left it right after posting it (`_left_with`) ended with it. Else None."""
    if (last := failed_after_last(sims[rank], reals[rank], differ, "peer_lost")) is None:
        return None
    at, mine = last
    if at.op in P2P_OPS:  # a p2p count pairs no two ranks' calls (`SendBandRace` is the p2p one)
        return None
    left = tuple(p for p in sorted(sims) if p != rank and p in reals
                 and _left_with(sims[p], reals[p], at, abs(failed_at(sims, p) - mine.t_issue)))
    return TeardownRace(rank, at.op, at.seq, at.group, left) if left else None


def _left_with(sim: RankResult, real: RankResult, at: TraceEntry, gap: float) -> bool:
    """Rank's process ended (not a hang) with collective `at` as its last, on both sides, and
    left it unfinished: it ended within `EXIT_RACE_S` (`gap`, the simulated clocks) of when
    the losing rank posted its part (one that posted much earlier met it up, one much later
    met its closure for sure), and on real Gloo it neither waited for `at` to end (its entry
    not retired) nor ended after it otherwise than failing in it with Gloo's error (a
    collective that ended on the leaver had its messages moved)."""
    def ended_with(p: RankResult) -> bool:
        last = p.trace[-1] if p.trace else None
        return (p.status in ("error", "completed") and last is not None
                and (last.group, last.seq, last.op) == (at.group, at.seq, at.op))

    failed_in_it = real.error is not None and real.error.category in GLOO_ERRORS
    return (ended_with(sim) and ended_with(real) and gap <= EXIT_RACE_S
            and (not real.trace[-1].completed or failed_in_it))


@dataclass(frozen=True)
class SendBandRace:
    """On real Gloo, rank `rank`'s send of `nbytes` to rank `peer` timed out: `peer` had posted
    its receive and ended with it, and the send was longer than what the kernel takes whole
    in one copy (`whole`, `simdist.socket_buffers.whole_write`), so its rest waited for a
    reader that was gone. The simulator completes it, as real Gloo does when the receiver
    lives long enough to read it (the module's docstring)."""

    kind: ClassVar[str] = "send_band"
    rank: int
    peer: int
    nbytes: int
    whole: int

    def describe(self) -> str:
        return (f"rank {self.rank}: send-band race, not a model difference: its send of {self.nbytes:,} bytes to "
                f"rank {self.peer}, which posted the receive and ended, is longer than the {self.whole:,} bytes "
                f"this kernel takes whole in one copy; on real Gloo the receiver was gone before the rest was written "
                f"or read, and the send never completed (its timeout, or torchrun's agent, ended it); the simulator "
                f"completes it")


def send_band_races(sim: Report, real: Report, cmp: Comparison) -> list[SendBandRace]:
    """The send-band races that make up every difference of `cmp`: each differing rank timed
    out in a send on real Gloo only (`_send_outlived`); a difference of no rank may only be the
    run's outcome, an error on real Gloo. Empty when the runs agree or anything else differs."""
    return every_differing_rank(sim, real, cmp, _send_outlived)


def _send_outlived(sims: dict[int, RankResult], reals: dict[int, RankResult], rank: int,
                   differ: set[str]) -> SendBandRace | None:
    """Rank `rank`'s last operation is a send longer than the kernel takes whole, which it
    completes in the simulator and times out in on real Gloo (or is stuck in when torchrun's
    agent ends it), having done and printed only
    what the simulator has it do first; its receiver ended with the matching receive as its
    last operation on both sides, within `EXIT_RACE_S` of both having posted (simulated
    clocks: a receiver that lived on read the send, whatever its size). Else None."""
    real = reals[rank]  # the stuck send ends at its timeout, or earlier by torchrun's agent's SIGTERM
    how = "killed" if real.exit is not None and real.exit.startswith(AGENT_TERMINATED) else "timeout"
    if (last := failed_after_last(sims[rank], real, differ, how)) is None:
        return None
    at, mine = last
    if at.op != "send" or at.peer is None:
        return None
    nbytes, whole, peer = at.numel * dtype_bytes(at.dtype.removeprefix("torch.")), whole_write(), at.peer
    ended = all(p is not None and p.status in ("error", "completed") and p.trace and p.trace[-1].op == "recv"
                and p.trace[-1].peer == rank and p.trace[-1].group == at.group
                for p in (sims.get(peer), reals.get(peer)))
    if not ended or nbytes <= whole:
        return None
    receiver = sims[peer]
    soon = receiver.time - max(mine.t_issue, receiver.trace[-1].t_issue) <= EXIT_RACE_S
    return SendBandRace(rank, peer, nbytes, whole) if soon else None


Race = ExitRace | RendezvousRace | ConnectRace | TeardownRace | SendBandRace | AgentRace | TieRace | ResetRace | SpawnRace | InitRace


def named_races(sim: Report, real: Report, cmp: Comparison) -> list[Race]:
    """The front door: the races of real processes that explain every difference of `cmp`
    (ranks' errors that are each an exit or a rendezvous race, a group-connection race, a
    teardown race, a send-band race, agent races, tie races, reset races, spawn races or init
    connect races, the first kind that explains them all); empty when the runs agree or something is left over: then all of it is
    a difference."""
    return (each_rank(sim, real, cmp, (exit_race, rendezvous_race)) or connect_races(sim, real, cmp)
            or teardown_races(sim, real, cmp) or send_band_races(sim, real, cmp) or agent_races(sim, real, cmp)
            or tie_races(sim, real, cmp) or reset_races(sim, real, cmp) or spawn_races(sim, real, cmp)
            or init_races(sim, real, cmp))


def race_jsonable(race: Race) -> dict[str, Any]:
    """A race as `simdist compare --json` writes it: its kind, its fields, its line."""
    return {"kind": race.kind, **asdict(race), "describe": race.describe()}
