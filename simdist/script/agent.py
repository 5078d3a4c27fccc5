"""torchrun's agent: once a worker fails, the others end by SIGTERM (real side; simulated: build).

What torch 2.13's torchrun does with its workers (`--max-restarts 0`, its default):
`launcher/api.py` runs the agent with `monitor_interval` 0.1 s; `SimpleElasticAgent._invoke_run`
(`elastic/agent/server/api.py`) polls the workers' exits every interval (`_monitor_workers` ->
`PContext.wait(0)` -> `SubprocessContext._poll`, `elastic/multiprocessing/api.py`), and the
poll that sees one exited non-zero (or by a signal; an exit 0 is no failure) closes the
context at once (`_close`): `os.killpg` SIGTERM to every live worker (each leads its own
session), a wait of at most 30 s, then SIGKILL to any left; it then records the ended
workers' exit codes (-15) beside the failure (ChildFailedError's table) and the group is
FAILED (`_stop_workers` -> `_shutdown` closes again: nothing left). A
worker with no SIGTERM handler of its own ends with exit code -15 wherever it stood (asleep,
computing, blocked in a collective with no peer failure); one already blocked in a collective
with the failed worker has usually failed by itself before ("Connection closed by peer", at
once on Gloo) and keeps that error. torchrun then raises ChildFailedError naming the first
failure by time as the root cause.

`Agent.poll` is the coordinator's `launched_done` for torchrun-style runs on real Gloo
(`api.execute`). Before it sends SIGTERM it asks each worker it is about to end for its
record, halted (a "dump" with `halt`, answered from the rank's reader thread, `rank.client`):
the user's line where the main thread stands at that instant, and the Flight Recorder's and
p2p operations issued until then, so the report says where the rank was and what it had
issued. The answer takes milliseconds (`agent_record_wait_s` 0.001 s measured, also without a
fork server: a process's first FR dump no longer imports torch._inductor,
`rank.flight._no_inductor_lookup`; it took 2.2-2.5 s), so the SIGTERM comes that much later;
meanwhile the halted rank tells the coordinator nothing more (no printed line, sleep or end of
its own: `Client._parked`), and its operations after the instant are dropped from its record,
so the report is the rank as torchrun's SIGTERM found it. The wait is bounded by
`RECORD_WAIT_S`. Once the agent acts, the stall rule's hang verdict is off: the agent ends
every live worker, so the run cannot hang.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from dataclasses import dataclass

from simdist.procs import LocalProcess
from simdist.race_walk import PEER_GONE
from simdist.report import RankError
from simdist.script.coordinator import Coordinator
from simdist.script.generations import latest
from simdist.script.ranks import RankConn
from simdist.vocab import AGENT_TERMINATED

MONITOR_INTERVAL_S = 0.1  # torchrun's LaunchConfig.monitor_interval default
CLOSE_TIMEOUT_S = 30.0  # PContext._close: SIGTERM, then SIGKILL after this long
# Real torchrun's SIGTERM reaches a peer once the failed process has ended (its teardown) and
# the next poll saw it. Measured on this 2-core host (`bench/torchrun_teardown_tally.sh`,
# docs/script-backend.md, "torchrun's agent"), from the failed rank's `raise`: its process
# either aborts early in its teardown (SIGABRT, "terminate called without an active
# exception": 0.03-0.12 s) or tears down in full (0.37-3.9 s, longer with load); the SIGTERM
# comes 0-0.1 s after its end.
TEARDOWN_MIN_S = 0.03  # the shortest teardown measured (the abort path)
AGENT_EARLIEST_S = 0.06  # the band of the SIGTERM after a failure: the earliest measured ...
AGENT_LATEST_S = 4.0  # ... and the latest (3.92 s at load 4), rounded up
# A failed process that ends with no interpreter teardown (`os._exit`, a signal: no traceback,
# no finalization) is seen at the next poll: the SIGTERM came 0.026-0.132 s after rank 1's
# `os._exit(1)` (`bench/torchrun_teardown_tally.sh RUNS os_exit`: 14 runs, load 2.2-5.2); a step
# later than this band after such a failure is the agent's firm verdict, not a race.
NO_TEARDOWN_EARLIEST_S = 0.02
NO_TEARDOWN_LATEST_S = 0.25


# A rank whose script returns is no ended worker yet: torchrun's agent counts a worker done when
# its process exits, and a process still in `destroy_process_group` or in its exit when the agent
# acts gets the SIGTERM (exit -15). Measured from the script's last line to the exit: Gloo's
# destroy_process_group 0.012-0.037 s, with live peers or aborted ones (`bench/exit_cost_probe.py`
# under `torchrun --standalone --nproc-per-node 3`, 2026-11-24, load 3.6-6.4); simdist's real side
# then skips the interpreter's teardown (`rank.exits.leave`): its exit report and process end come
# 0.03-0.15 s after the last line (fork server / plain launch, docs "torchrun's agent"); real
# torchrun's full teardown is longer (0.37-3.9 s) or aborts (SIGABRT, exit -6: 2 of 3 runs of
# the probe's `abort` mode).
EXIT_MIN_S = 0.01  # the shortest exit after a script's return (destroy_process_group's floor)
EXIT_MAX_S = 0.2  # the longest on simdist's real side (plain launch 0.15 s + destroy 0.04 s)


def exit_band(returned_at: float) -> tuple[float, float]:
    """When the process of a rank whose script returned at `returned_at` ends: an agent acting
    before the band's start ends it by SIGTERM, one inside it races its exit, one after finds
    it completed."""
    return returned_at + EXIT_MIN_S, returned_at + EXIT_MAX_S


def exit_races_sigterm(returned_at: float, failed_at: float, tore_down: bool) -> bool:
    """Whether the process of a rank whose script returned at `returned_at` may end either
    side of real torchrun's SIGTERM after a failure at `failed_at`: its exit (`exit_band`)
    and the SIGTERM's band (`sigterm_band`) overlap. A race both ways (`AgentRace`): the
    SIGTERM ends it in destroy_process_group or its exit (exit -15), or finds it completed."""
    lo, hi = exit_band(returned_at)
    earliest, latest = sigterm_band(tore_down)
    return failed_at + earliest <= hi and lo <= failed_at + latest


def sigterm_band(tore_down: bool) -> tuple[float, float]:
    """The band of real torchrun's SIGTERM, in seconds after a failure: after a process that
    tore its interpreter down (an exception, `sys.exit`), `AGENT_EARLIEST_S`-`AGENT_LATEST_S`;
    after one that ended without (`os._exit`, a signal), within a poll of its end."""
    return (AGENT_EARLIEST_S, AGENT_LATEST_S) if tore_down else (NO_TEARDOWN_EARLIEST_S, NO_TEARDOWN_LATEST_S)


def agent_instant(failed_at: float) -> float:
    """When the simulated agent ends the others, given the first failure on the simulated
    clock: after the shortest teardown and a whole monitor interval, inside the measured band,
    where simdist's real side (whose ranks skip the interpreter's teardown, `rank.exits`) ends
    them too. A rank whose next step falls in the band is a race both ways (`AgentRace`)."""
    return failed_at + TEARDOWN_MIN_S + MONITOR_INTERVAL_S


RECORD_WAIT_S = 30.0  # at most this long for the records of the ranks about to be ended (halted meanwhile)


def terminated_words(by: int) -> str:
    """How the report names a rank the agent ended (both sides)."""
    return f"{AGENT_TERMINATED} after rank {by} failed"


def sigterm_error() -> RankError:
    """The error of a rank the agent ended (both sides): its process died of the SIGTERM."""
    return RankError("SIGTERM", "Signal 15 (SIGTERM) received: exit code -15", "killed")


def failed(code: int | None) -> bool:
    """A worker's exit that makes torchrun's agent stop the others: non-zero, or a signal."""
    return code is not None and code != 0


@dataclass
class Failure:
    """The root cause: the first worker seen to fail (torchrun's "first observed failure")."""

    rank: int
    code: int
    seen_at: float  # time.monotonic() of the poll that saw it


class Agent:
    """Polls the workers as torchrun's agent does and ends the rest once one fails.
    `procs[r]` is rank r's launched process; the coordinator holds its connection (none
    before its init), by which it is asked for its record and marked."""

    def __init__(self, procs: list[LocalProcess], coord: Coordinator, interval_s: float = MONITOR_INTERVAL_S):
        self.procs = procs
        self.coord = coord
        self.interval_s = interval_s
        self.failure: Failure | None = None
        self._next = 0.0
        self._asked: dict[int, RankConn | None] = {}  # rank -> its connection when asked (None: none)
        self._asked_at = 0.0
        self._termed_at: float | None = None
        self._killed = False
        self.record_wait_s: float | None = None  # how much later than torchrun's the SIGTERM came

    def poll(self) -> bool:
        """One look (at most every monitor interval); whether every worker has ended."""
        now = time.monotonic()
        if now >= self._next:
            self._next = now + self.interval_s
            self._monitor(now)
        self._act(now)
        return all(not p.alive() for p in self.procs)

    def _monitor(self, now: float) -> None:
        if self.failure is not None:
            return
        codes = [p.popen.poll() for p in self.procs]
        bad = [r for r, c in enumerate(codes) if failed(c)]
        if not bad:
            return
        first = bad[0]
        self.failure = Failure(first, int(codes[first]), now)  # type: ignore[arg-type]
        self.coord.stalls = None  # no hang verdict from now on: the agent ends every live worker
        for r, p in enumerate(self.procs):
            if p.alive():
                c = latest(self.coord.gens, r)
                if c is not None and c.connected and c.exit is None:
                    c.terminated = terminated_words(first)
                    c.record = None
                    self.coord._send(c, {"t": "dump", "halt": True})
                self._asked[r] = c
        self._asked_at = now

    def _act(self, now: float) -> None:
        if self.failure is None:
            return
        if self._termed_at is None:
            waiting = [c for c in self._asked.values() if c is not None and c.connected and c.exit is None
                       and c.record is None]
            if waiting and now - self._asked_at < RECORD_WAIT_S:
                return
            self._termed_at = now
            self.record_wait_s = now - self._asked_at
            self._signal(signal.SIGTERM)
        elif not self._killed and now - self._termed_at >= CLOSE_TIMEOUT_S:
            self._killed = True
            self._signal(signal.SIGKILL)

    def _signal(self, sig: signal.Signals) -> None:
        for r in self._asked:
            p = self.procs[r]
            if p.alive():
                with contextlib.suppress(ProcessLookupError, PermissionError):
                    os.killpg(p.pid, sig)  # as torchrun: the worker's whole process group


class ClockAgent:
    """Simulated, torchrun-style: the agent on the simulated clock, as far as processes go.
    The report's side is `build._agent_on_clock` (what stands at the agent's instant); this
    only ends the process of a rank whose clock has passed that instant, so a rank that would
    run on for long (a loop with no collective with the failed rank) is not left to the
    watchdog: what it does after the instant is dropped from the report anyway, and its
    process's end fails its peers' operations only at or after its clock, past the instant."""

    def __init__(self, procs: list[LocalProcess], coord: Coordinator):
        self.procs = procs
        self.coord = coord
        self.at: float | None = None  # the agent's instant on the simulated clock, once a rank failed

    def poll(self) -> bool:
        # every poll: a failure seen later in wall time may be earlier on the simulated clock
        # (the instant only moves earlier, so a rank ended for passing it has passed the final one)
        ends = [t for c in self.coord.members() if (t := self._failed(c)) is not None]
        if ends:
            self.at = agent_instant(min(ends))
        if self.at is not None:
            for c in self.coord.members():
                if c.connected and c.clock > self.at and c.rank is not None and c.rank < len(self.procs):
                    self.procs[c.rank].kill()
        return all(not p.alive() for p in self.procs)

    def _failed(self, c: RankConn) -> float | None:
        """When an ended membership failed on the simulated clock; None: not a failure, or one
        not known yet. A failure is what torchrun sees, its process's non-zero exit status (a
        rank that caught its error and exited 0 failed nobody, whatever error it reported: not
        yet known while its process runs); when: its end (`_ended_at`)."""
        if c.connected or c.rank is None or c.rank >= len(self.procs) or not failed(self.procs[c.rank].popen.poll()):
            return None
        return self._ended_at(c)

    def _ended_at(self, c: RankConn, seen: frozenset[int] = frozenset()) -> float | None:
        """When an ended membership ended on the simulated clock: its clock, or, for one that lost
        a peer, no earlier than the peer's own end; None while that peer has not ended."""
        cause = PEER_GONE.search(str((c.exit or {}).get("error", {}).get("message", "")))
        if cause is None or int(cause.group(1)) in seen:
            return c.clock
        peer = next((m for m in self.coord.members() if m.rank == int(cause.group(1)) and m.gen is c.gen), None)
        if peer is None or peer.connected:
            return None
        t = self._ended_at(peer, seen | {c.rank})
        return None if t is None else max(c.clock, t)
