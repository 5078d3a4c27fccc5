"""The `Report` of a script run: per rank its trace, status, error, printed lines, and the
line of the user's code where it is blocked or where it left; findings and explanations.

The report is the scenario path's (`simdist.report.Report`, source "sim"), so the checker's
findings, the wait-for graph, `--json` and the Chrome trace work unchanged.
"""

from __future__ import annotations

import dataclasses
import linecache
import signal
from typing import Any

from simdist.agent_race import agent_race_note, tied_timeout
from simdist.check.classify import judge, run_findings
from simdist.check.trace_hints import trace_hints
from simdist.check.waitfor import build_waitfor
from simdist.closure_races import tie_race_notes
from simdist.frames import Frame
from simdist.race_walk import failed_at, lost_peer
from simdist.report import (
    SHUTDOWN_ABORT,
    CodeLocation,
    Finding,
    RankError,
    RankResult,
    Report,
    TraceEntry,
    error_category,
    overall_outcome,
    shutdown_abort,
)
from simdist.script import env
from simdist.script.agent import (
    MONITOR_INTERVAL_S,
    TEARDOWN_MIN_S,
    agent_instant,
    exit_band,
    exit_races_sigterm,
    sigterm_band,
    sigterm_error,
    terminated_words,
)
from simdist.script.agent import failed as agent_failed
from simdist.script.barriers import STORE_BARRIER
from simdist.script.coordinator import Coordinator, Ending
from simdist.script.detail import relabel_unnamed
from simdist.script.frtrace import fr_trace
from simdist.script.generations import latest, memberships, merged_groups, summary
from simdist.script.race_notes import lost_after_teardown, race_notes, tore_down
from simdist.script.ranks import RankConn, exit_words, first_user, per_process, waiting_in
from simdist.script.rendezvous import INIT_WAIT, ended_without_init, entered_at
from simdist.script.stalls import WATCHDOG


class Groups:
    """The checker asks a scenario for group members; a script's groups are the engine's."""

    def __init__(self, groups: dict[str, list[int]]):
        self.groups = groups

    def group_ranks(self, name: str) -> list[int]:
        return self.groups[name]


def location(file: str, line: int, function: str) -> CodeLocation:
    return CodeLocation(file, int(line), function, linecache.getline(file, int(line)).strip())


def _user_location(raw: list[Any]) -> CodeLocation | None:
    f = first_user(raw)
    return location(*f) if f is not None else None


def _op_location(frames: list[Frame], user: list[bool]) -> CodeLocation | None:
    for f, u in zip(frames, user, strict=True):
        if u:
            return location(f.filename, f.line, f.name)
    return None


def _terminated(conn: RankConn, returncode: int | None) -> str | None:
    """How torchrun's agent ended the rank, when it did (`simdist.script.agent`): it was
    asked to, and its process died of that SIGTERM."""
    if conn.terminated is not None and returncode == -signal.SIGTERM:
        return conn.terminated
    return None


def _own_end(conn: RankConn, returncode: int | None) -> dict[str, Any] | None:
    """How the rank itself was ending: what it told (`exit`), or, ended by torchrun's agent
    while on its way out (an exception raised, its report not sent yet), what it answered
    the agent (`rank.exits.snapshot`'s `exiting`)."""
    if conn.exit is not None or _terminated(conn, returncode) is None:
        return conn.exit
    return (conn.record or {}).get("exiting")


def _how(conn: RankConn, returncode: int | None) -> str:
    x = _own_end(conn, returncode)
    if (term := _terminated(conn, returncode)) is not None:
        return f"{exit_words(x)}, then {term}" if x is not None and x.get("error") else term
    if x is None:
        if returncode is not None and returncode < 0:
            return f"killed by signal {-returncode}"
        return "ended without a word (killed?)"
    return exit_words(x)


def _ended(conn: RankConn, aborted: RankError | None, returncode: int | None) -> tuple[str, RankError | None]:
    if aborted is not None:
        return "aborted", aborted
    x = _own_end(conn, returncode)
    if _terminated(conn, returncode) is not None and not (x or {}).get("error"):
        return "error", sigterm_error()
    if x is None and returncode == -signal.SIGABRT:
        # no Python ran to report it: on Gloo, an I/O thread's uncaught gloo::EnforceNotMet
        return "aborted", RankError("SIGABRT", "the process aborted (SIGABRT): Gloo's I/O thread threw, e.g. on a "
                                               "message longer than its receive", "gloo_abort")
    if x is None:
        return "error", RankError("Killed", "the process ended without reporting how (killed by a signal?)", "killed")
    if x.get("error"):
        msg = x["error"]["message"]
        return "error", RankError(x["error"]["type"], msg, error_category(msg, runtime_error=True))
    code = x.get("code") or 0
    if code:  # sys.exit(code) raises SystemExit; os._exit(code) raises nothing, it ends the process
        kind = "os._exit" if x.get("how") == "os._exit" else "SystemExit"
        return "error", RankError(kind, f"exit code {code}", "other")
    return "completed", None


def _trace(members: list[RankConn], r: int, real: bool) -> list[TraceEntry]:
    """Rank r's operations in every generation it joined, oldest first. Simulated: each
    generation's engine's. Real: each process's Flight Recorder (at exit, or the answer a hung
    rank gave before it was killed: `Coordinator.collect_records`), whose entries name their
    generation already (`rank.flight`); a process that initialised again holds several."""
    trace: list[TraceEntry] = []
    seen: set[int] = set()
    for m in members:
        if not real:
            trace.extend(m.gen.engine.ranks[r].trace)
            continue
        x = m.exit or m.record or {}
        if x.get("fr") is not None or x.get("p2p") is not None:
            if id(x) not in seen:
                seen.add(id(x))
                trace.extend(fr_trace(x.get("fr") or {}, x.get("p2p"), x.get("args")))
    return trace


def _never_initialised(r: int, returncode: int | None, x: dict[str, Any] | None,
                       trace: list[TraceEntry] | None = None) -> RankResult:
    """A rank whose process never initialised a process group; `x`: how and where it ended
    (`rendezvous`), when it said."""
    ended = f" (its process ended with exit code {returncode} before calling init_process_group)" \
        if returncode is not None else ""
    err = RankError("ScriptError", f"no process initialised this rank's process group{ended}", "other")
    return RankResult(rank=r, status="error", error=err, trace=trace or [], exit=ended_without_init(x) if x else None,
                      location=location(*x["where"][:3]) if x and x.get("where") else None)


def _rank_result(coord: Coordinator, r: int, ending: Ending, returncode: int | None, real: bool) -> RankResult:
    members = memberships(coord.gens, r)
    trace = _trace(members, r, real)
    conn = members[-1] if members else None
    if conn is None:
        return _never_initialised(r, returncode, coord.no_init.get(r), trace)
    rs = conn.gen.engine.ranks[r]
    where: CodeLocation | None = None
    blocked = waiting = None
    # still running when the run was ended: also a process that destroyed its group and lives on
    if conn.connected and conn.exit is None and ending.kind in ("hang", "timeout", "interrupted"):
        status, error = "hang", None
        pending = [e for e in trace if conn.active() and not e.completed and e.t_done is None  # in its own generation
                   and env.generation_of(e.group) == conn.gen.index]
        if conn.block is not None:  # (no op: TORCH_DIST_INIT_BARRIER's store barrier, `rendezvous`)
            waiting = conn.ops[conn.block.ids[0]].entry if conn.block.ids else None
            where = _user_location(conn.block.frames)
        elif conn.record is not None and conn.record.get("where"):
            where = location(*conn.record["where"][:3])
        elif conn.init_wait is not None:  # for the rest of its world (`simdist.script.rendezvous`)
            where = _user_location(conn.init_wait.frames)
        blocked = pending[0] if pending else waiting
        store = conn.store_wait()  # real Gloo: waiting at the c10d store, named as the simulator names it
        how = INIT_WAIT if conn.init_wait is not None else store[0] if store is not None else \
            "still running" if ending.kind != "hang" else \
            (conn.block.label or STORE_BARRIER) if conn.block is not None and not conn.block.ids else "blocked"
    else:
        status, error = _ended(conn, rs.abort_error, returncode)
        x = _own_end(conn, returncode) or (conn.record if _terminated(conn, returncode) else None) or {}
        if x.get("where"):
            where = location(*x["where"][:3])
        how = _how(conn, returncode)
    if where is None and (last := conn.last_op()) is not None:
        where = _op_location(last.frames, last.user)
    return RankResult(rank=r, status=status, error=error, trace=trace, time=conn.clock,  # type: ignore[arg-type]
                      inputs_processed=per_process(members, lambda m: m.batches),
                      blocked_in=blocked, waiting_in=waiting,
                      output=[line for m in members for line in m.stdout],
                      stderr=[line for m in members for line in m.stderr],
                      location=where, exit=how, compute=[s for m in members for s in m.compute])


def _where_at(conn: RankConn, t: float) -> CodeLocation | None:
    """The user's line a simulated rank stood at at clock `t`: the last operation it issued
    or sleep it began by then."""
    marks = [(c, raw) for c, raw in conn.sleeps if c <= t]
    marks += [(rec.entry.t_issue, None, rec) for rec in conn.ops.values() if rec.entry.t_issue <= t]  # type: ignore[misc]
    if not marks:
        return None
    last = max(marks, key=lambda m: m[0])
    return _user_location(last[1]) if last[1] is not None else _op_location(last[2].frames, last[2].user)


def _agent_on_clock(coord: Coordinator, ranks: list[RankResult], codes: list[int | None]) -> list[str]:
    """Simulated, torchrun-style: torchrun's agent (`simdist.script.agent`) on the simulated
    clock. The first rank to fail (by its clock at its end; a failure as torchrun sees it: its
    process's exit status `codes[rank]`, non-zero) makes it act at `agent_instant`,
    `t`; every other rank that had not ended by then is ended there by SIGTERM: what it did
    after `t` (operations issued, lines printed, its own end) did not happen. A rank that ended
    by `t` (a peer's loss in a collective with the failed rank) keeps its end.
    The simulated ranks ran on past `t`, but an event after `t` cannot change one before it
    (a completion comes at or after every member's post), so what stands at `t` is the same.
    Returns the report's notes: the agent's instant, and each rank whose next step (its own
    end, an operation, a sleep) fell inside the band of real torchrun's SIGTERM after the
    failure (`agent.sigterm_band`, by whether the failed process tore its interpreter down):
    a race both ways (`agent_race`); so is a rank's loss of a peer below the band (its reaction
    races the poll: docs, "torchrun's agent"). For a rank whose script returned, that step is its
    process's exit (`agent.exit_band`): a race wherever the two bands overlap, whichever side
    of the exit the simulator's instant falls (a real rank SIGTERMed in destroy_process_group
    while the simulator completed it: examples/grad_accum_no_join.py under CI load)."""
    by_rank = {r.rank: r for r in ranks}
    # when each failed (a rank that lost a peer: when that peer exited or timed out, `race_walk.failed_at`)
    failed = {r.rank: failed_at(by_rank, r.rank) for r in ranks
              if r.status in ("error", "aborted") and r.exit is not None and r.time is not None
              and (r.rank >= len(codes) or agent_failed(codes[r.rank]))}
    if not failed:
        return []
    # at a tie, a rank that lost a peer comes after one that failed on its own (its loss is of that end)
    first = by_rank[min(failed, key=lambda rank: (failed[rank], lost_peer(by_rank[rank]) is not None, rank))]
    f0 = failed[first.rank]
    t = agent_instant(f0)
    torn = tore_down(coord, first.rank)
    earliest, latest_s = sigterm_band(torn)
    expired_in = {x.rank: x.entry.group for x in coord.expired}  # the group of each rank's last timed-out wait
    notes = []
    for i, r in enumerate(ranks):
        conn = latest(coord.gens, r.rank)
        # its first step past the failure: its own end, or (`agent.ClockAgent` ended it past `t`) its next message
        step = failed.get(r.rank, r.time)
        returned = r.status == "completed" and r.time is not None  # its process ends later: `exit_band`
        via = lost_after_teardown(coord, r, first.rank, failed)  # its loss's window meets the band's
        lost = lost_peer(r) if r.rank in failed else None  # its failure a loss: its reaction races the poll
        tied = (r.rank in failed and tied_timeout(first, r, failed[r.rank] - f0)  # in the first's group: measured
                and expired_in.get(r.rank, "") == expired_in.get(first.rank))  # (across groups: docs, "torchrun's agent")
        if r is not first and not returned and r.status != "hang" and step is not None and (
                f0 + earliest <= step <= f0 + latest_s or tied
                or lost is not None and step + (TEARDOWN_MIN_S if via is not None else 0.0) <= f0 + latest_s):
            notes.append(agent_race_note(r.rank, "next step" if step > t else "own end", step - f0, first.rank,
                                         via, lost, tied))
        if returned and r is not first:
            lo = exit_band(r.time)[0]  # type: ignore[arg-type]
            if exit_races_sigterm(r.time, f0, torn):  # type: ignore[arg-type]
                notes.append(agent_race_note(r.rank, "next step" if t < lo else "own end", max(lo - f0, 0.0),
                                             first.rank))
            if t >= lo or conn is None:  # the simulator's agent came once its process may have ended: it completed
                continue
        elif r is first or conn is None or (r.status != "hang" and step is not None and step <= t):
            continue
        if conn.gen.failed and not r.trace and (entered_at(conn.gen, r.rank) or 0.0) > t:
            ranks[i] = _never_initialised(r.rank, -int(signal.SIGTERM), None)  # asleep before its init, as on real Gloo
            continue
        out = [line for line, at in zip(r.output, conn.stdout_at, strict=False) if at <= t]
        ranks[i] = dataclasses.replace(
            r, status="error", error=sigterm_error(), exit=terminated_words(first.rank), time=t,
            trace=[e for e in r.trace if e.t_issue is None or e.t_issue <= t], output=out,
            inputs_processed=r.inputs_processed - conn.batches_after(t),
            blocked_in=None, waiting_in=None,
            location=r.location if returned else _where_at(conn, t) or r.location)
        notes.append(f"rank {r.rank}: {terminated_words(first.rank)} at t={t:.3f} s (simulated: rank {first.rank} "
                     f"failed at t={f0:.3f} s; the agent acts after the shortest teardown measured, "
                     f"{TEARDOWN_MIN_S:g} s, and a poll, {MONITOR_INTERVAL_S:g} s)")
    return notes


def _notes(report: Report, coord: Coordinator, ending: Ending) -> list[str]:
    notes: list[str] = []
    for r in report.ranks:
        at = f" at {r.location.short()}" if r.location is not None else ""
        if r.status == "hang" and r.waiting_in is not None:
            notes.append(f"rank {r.rank} is blocked in {r.waiting_in.short()}{at}")
        elif r.status == "hang" and report.source == "real" and r.blocked_in is not None:
            notes.append(f"rank {r.rank} is blocked (its oldest unfinished operation: {r.blocked_in.short()}){at}")
        elif r.status == "hang":
            waits = r.exit is not None and r.exit.startswith(waiting_in(""))  # (INIT_WAIT, NEW_GROUP_WAIT, STORE_BARRIER, real store waits)
            notes.append(f"rank {r.rank} is {r.exit if waits else 'still running'}{at}")
        elif r.exit is not None:
            said = r.error.message.splitlines()[0] if r.error and r.error.message else ""
            # the exit names the exception ("raised ValueError") or the call ("os._exit(3)") already
            named = r.error is not None and (r.exit == f"raised {r.error.type}" or r.exit.startswith(r.error.type))
            err = (f": {said}" if named else f": {r.error.type}: {said}") if r.error else ""
            last = next((e for e in reversed(r.trace)), None)
            after = f" (its last operation: {last.short()})" if last is not None else ""
            notes.append(f"rank {r.rank} left: {r.exit}{err}{at}{after}")
    notes.extend(coord.init_notes())
    notes.extend(coord.group_notes())
    if report.source == "sim" and ending.kind in ("hang", "interrupted"):  # how real torch ends it (`rendezvous`)
        notes.extend(coord.default_timeouts() + coord.barrier_default_timeouts() + coord.store_default_timeouts())
    notes.extend(_timeout_notes(coord))
    notes.extend(coord.wake_notes())
    if report.source == "real" and ending.kind in ("hang", "timeout"):
        last = [latest(coord.gens, r) for r in range(coord.world_size)]
        silent = [c.rank for c in last if c is not None and c.exit is None and c.record is None]
        if silent:
            notes.append(f"ranks {sorted(silent)} did not answer the request for their record before they were "
                         f"killed: their operations and line are unknown")
    if report.ranks and not any(r.inputs_processed for r in report.ranks):
        # a script's inputs are its DataLoaders' batches: a 0 column would read as "did nothing"
        notes.append("inputs: no rank's DataLoaders yielded a batch (a script's inputs are the batches its "
                     "DataLoaders yield; loops over other data are not counted)")
    if ending.early is not None:  # the verdict came from the stall rule, not the watchdog
        notes.append(ending.early)
    if (gens := summary(coord.gens)) is not None:
        notes.append(gens)
    if ending.kind == "hang":
        wf = build_waitfor(report, Groups(merged_groups(coord.gens)))  # type: ignore[arg-type]
        gone = [r.rank for r in report.ranks if r.status != "hang"]
        blocked = wf.blocked or [r.rank for r in report.ranks if r.status == "hang"]  # (in init: no operation)
        line = f"hang: every live rank is blocked in an operation that can no longer complete; blocked ranks {blocked}"
        if wf.culprits or gone:
            line += f", waiting on ranks {wf.culprits or gone}"
        notes.append(line)
        if coord.backend == "nccl" and gone:
            notes.append("backend nccl: a peer that exits leaves its partners blocked (NCCL's watchdog would end "
                         "them after its timeout); with gloo they would fail with 'Connection closed by peer'")
    elif ending.kind == "timeout" and report.source == "real" and all(
            r.blocked_in is not None for r in report.ranks if r.status == "hang"):
        notes.append(f"{WATCHDOG} no rank communicated in time; each rank still running answered, before it was "
                     "killed, that it is blocked in an unfinished operation (above)")
    elif ending.kind == "interrupted":
        notes.append("interrupted (Ctrl-C): the run was ended as it stood; the ranks still running are reported so")
    elif ending.kind == "timeout":
        notes.append(f"{WATCHDOG} the run did not finish in time and no hang was proven (a rank may be computing "
                     "or spinning without communicating)")
    return notes


def _timeout_notes(coord: Coordinator) -> list[str]:
    """The hang that Gloo's timeout ended (`simdist.script.deadlines`): which rank waited in
    which operation, at which line, until when; a run that times out is still a hang to debug."""
    notes = []
    for x in coord.expired:
        where = _user_location(x.frames)
        at = f" at {where.short()}" if where is not None else ""
        notes.append(f"rank {x.rank} was blocked in {x.entry.short()}{at} until its {x.limit_s:g} s timeout "
                     f"(t={x.deadline:.3f} s): {x.message}")
    if coord.expired:
        notes.append("timeout: Gloo's timeout ended waits that no rank could complete any more (a hang that the "
                     "group's timeout turns into errors)")
    return notes + tie_race_notes(coord.expired)


def build_report(coord: Coordinator, ending: Ending, name: str, returncodes: list[int | None],
                 timings: dict[str, float], real: bool = False) -> Report:
    """The report of a run that initialised a process group (`coord.gens` is not empty).
    `returncodes[r]`: rank r's process exit status, where the launcher started the ranks.
    `real`: the ranks ran on real Gloo (the launcher's "gloo" mode), their traces come from FR."""
    assert coord.gens
    ranks = [_rank_result(coord, r, ending, returncodes[r] if r < len(returncodes) else None, real)
             for r in range(coord.world_size)]
    agent = _agent_on_clock(coord, ranks, returncodes) if returncodes and not real else []  # torchrun-style (real: `api.execute`)
    report = Report(scenario=name, source="real" if real else "sim", outcome=overall_outcome([r.status for r in ranks]), ranks=ranks,
                    findings=[f for g in coord.gens for f in g.engine.findings], backend=coord.backend or "gloo",
                    world_size=coord.world_size, timings=dict(timings))
    have = {(f.kind, f.group, f.seq, tuple(f.ranks)) for f in report.findings}
    for f in run_findings(report, Groups(merged_groups(coord.gens))):  # type: ignore[arg-type]
        if (f.kind, f.group, f.seq, tuple(f.ranks)) not in have:
            report.findings.append(f)
    report.findings.extend(Finding("rank_error", "WORLD", 0, [], e) for e in coord.protocol_errors)
    report.notes = _notes(report, coord, ending) + agent + ([] if real else race_notes(coord, ranks))
    # why, read from the traces (the call sites that met at one sequence number, a rank that
    # finished while others wait): what a scenario's explanation says, for the user's script
    report.notes.extend(trace_hints(report, judge(report, list(report.findings))))
    for r in range(coord.world_size):
        conn = latest(coord.gens, r)
        rc = returncodes[r] if r < len(returncodes) else None
        if conn is not None and shutdown_abort(rc, finished=conn.exit is not None):
            report.notes.append(f"rank {r}: ended by SIGABRT after it had reported its end "
                                f"({report.ranks[r].exit}): {SHUTDOWN_ABORT}")
    relabel_unnamed(report, coord)  # TORCH_DISTRIBUTED_DEBUG=DETAIL's groups, as Gloo's FR records them
    return report
