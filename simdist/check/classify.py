"""Failure classification and the loop's semantic invariants.

Kinds follow the trusted tools: PyTorch's Flight Recorder analyzer (collective type
mismatch, size mismatch, dtype mismatch, missing ranks) and the
TORCH_DISTRIBUTED_DEBUG=DETAIL fingerprint check (op type, tensor shapes and dtypes,
reduce op, root). The engine reports the fingerprint mismatches it saw while pairing
(``op_mismatch``, ``size_mismatch``, ``dtype_mismatch``, ``reduce_op_mismatch``,
``root_mismatch``, ``p2p_size_mismatch``); this module adds what only the finished run
shows:

* ``hang``: ranks missing from a collective that other ranks wait in;
* ``p2p_unmatched``: a send/recv whose partner never posted the matching op;
* ``deadlock``: blocked ranks that wait on each other (a cycle in the wait-for graph);
* ``peer_exited``: a collective that failed because a member's process had ended;
* ``rank_error``: any other exception a rank raised (Join's early-termination error, ...);
* ``invariant:<name>``: a completed run that broke a semantic invariant of the loop
  (``collective_counts``, ``unfinished_collective``, ``inputs``, ``ddp_final_model``,
  ``p2p_counts``, ``joinable_sync``).
"""

from __future__ import annotations

import re
from collections import Counter
from dataclasses import dataclass, field
from itertools import compress
from operator import attrgetter

from simdist.check.waitfor import WaitFor, build_waitfor, collective_index, group_members
from simdist.report import Finding, RankResult, Report, TraceEntry
from simdist.scenario import Scenario, StopStep
from simdist.vocab import MISMATCH_KINDS, P2P_OPS

# Which finding names the root cause when several are present (first wins).
PRIORITY = (*MISMATCH_KINDS, "p2p_unmatched", "deadlock", "hang", "peer_exited", "rank_error")


@dataclass
class Verdict:
    """What the checker concludes about one run."""

    failed: bool
    kind: str  # the root-cause kind (see PRIORITY) or "invariant:<name>"; "ok" when nothing failed
    outcome: str
    findings: list[Finding] = field(default_factory=list)  # engine + checker + invariant findings
    signature: str = "ok"  # stable name of the failure class (kind, outcome, origins), for counting
    summary: str = ""
    waitfor: WaitFor | None = None

    def to_dict(self) -> dict:
        from dataclasses import asdict

        return {
            "failed": self.failed,
            "kind": self.kind,
            "outcome": self.outcome,
            "signature": self.signature,
            "summary": self.summary,
            "findings": [asdict(f) for f in self.findings],
            "waitfor": self.waitfor.to_dict() if self.waitfor is not None else None,
        }


def failing_entry(report: Report, rank: int) -> TraceEntry | None:
    """The op a rank was stuck in (hang) or that failed under it (error): blocked_in or last unfinished."""
    r = report.ranks[rank]
    if r.blocked_in is not None:
        return r.blocked_in
    for e in reversed(r.trace):
        if not e.completed:
            return e
    return None


_EXITED = re.compile(r"rank (\d+) has exited")


def run_findings(report: Report, scenario: Scenario | None, wf: WaitFor | None = None) -> list[Finding]:
    """Findings the finished run shows: missing ranks, unmatched p2p, deadlock cycles, exited peers."""
    wf = wf or build_waitfor(report, scenario)
    g = wf.graph
    out: list[Finding] = []
    index = collective_index(report) if wf.blocked else []
    seen: set[tuple[str, int]] = set()
    for rank in wf.blocked:
        e = report.ranks[rank].blocked_in
        assert e is not None
        if e.within:  # a call's hidden message (monitored_barrier's): no collective of the trace
            continue
        if e.op in P2P_OPS:
            peers = [b for b in g.successors(rank) if g.edges[rank, b]["reason"] == "p2p"]
            if peers:
                want = "send" if e.op == "recv" else "recv"
                out.append(Finding("p2p_unmatched", e.group, e.seq, [rank, *peers],
                                   f"rank {rank} waits in {e.op} {'from' if e.op == 'recv' else 'to'} rank {e.peer} "
                                   f"({e.origin}); rank {e.peer} never posted the matching {want}"))
            continue
        key = (e.group, e.seq)
        if key in seen:
            continue
        seen.add(key)
        members = group_members(scenario, report, e.group)
        missing = [m for m in members if (e.group, e.seq) not in index[m]]
        if missing:
            ins = {m: report.ranks[m].blocked_in for m in members if m in wf.blocked}
            waiting = [m for m, b in ins.items() if b is not None and not b.within and (b.group, b.seq) == key]
            elsewhere = "".join(f"; rank {m} waits in {b.within}" for m, b in ins.items() if b is not None and b.within)
            out.append(Finding("hang", e.group, e.seq, missing, f"#{e.seq} {e.op} on {e.group}: ranks {waiting} "
                                                                f"wait in it, ranks {missing} never issued it{elsewhere}"))
    if wf.cycle:
        for comp in wf.core:
            if len(comp) > 1 or g.has_edge(comp[0], comp[0]):
                where = "; ".join(f"rank {r} in {report.ranks[r].blocked_in.short()}" for r in comp
                                  if report.ranks[r].blocked_in is not None)
                first = report.ranks[comp[0]].blocked_in
                out.append(Finding("deadlock", first.group if first else "WORLD", first.seq if first else 0, comp,
                                   f"ranks {comp} wait on each other: {where}"))
    for r in report.ranks:
        if r.status != "error" or r.error is None:
            continue
        e = failing_entry(report, r.rank)
        if r.error.category == "peer_lost":
            m = _EXITED.search(r.error.message)
            dead = [int(m.group(1))] if m else _gone_members(report, scenario, r.rank, e)
            what = e.short() if e is not None else "a collective"
            gone = f"rank {dead[0]}" if len(dead) == 1 else f"ranks {dead}" if dead else "a peer"
            out.append(Finding("peer_exited", e.group if e else "WORLD", e.seq if e else 0, [r.rank, *dead],
                               f"rank {r.rank}'s {what} failed: {gone} had exited"))
        elif r.error.category != "gloo_abort":
            out.append(Finding("rank_error", e.group if e else "WORLD", e.seq if e else 0, [r.rank],
                               f"rank {r.rank} {_verb(r.error.type)} {r.error.type}: {r.error.message}"))
    return out


def _verb(error_type: str) -> str:
    """A script's rank that ends by os._exit(code) (simdist.script.build) raised nothing."""
    return "called" if error_type == "os._exit" else "raised"


def _gone_members(report: Report, scenario: Scenario | None, rank: int, e: TraceEntry | None) -> list[int]:
    """The members that never issued the collective a rank lost its peer in and are not blocked
    (their process ended): who it lost, when the error message does not say (real Gloo's
    "Connection closed by peer [addr]" names an address, not a rank)."""
    if e is None or e.op in P2P_OPS:
        return []
    return [m for m in group_members(scenario, report, e.group) if m != rank and m < len(report.ranks)
            and report.ranks[m].status != "hang"
            and not any((x.group, x.seq) == (e.group, e.seq) for x in report.ranks[m].trace if x.op not in P2P_OPS)]


def invariant_findings(report: Report, scenario: Scenario) -> list[Finding]:
    """Semantic invariants of a loop that completed; each violation is an ``invariant:<name>`` finding."""
    if report.outcome != "completed":
        return []
    out: list[Finding] = []
    w = len(report.ranks)
    counts = scenario.counts()
    done = [r.inputs_processed for r in report.ranks]
    short = [r for r in range(w) if done[r] != counts[r] and not may_stop(scenario, r)]
    if short:
        out.append(Finding("invariant:inputs", "WORLD", 0, short, f"ranks processed {done} inputs but were given {counts}"))
    # one pass over every trace: per-group collective counts, unfinished ops, p2p pairs, final-model broadcasts
    groups = {"WORLD": list(range(w))} | {g.name: sorted(g.ranks) for g in scenario.groups}
    per_group: list[dict[str, int]] = []
    sends: dict[tuple[int, int], int] = {}
    recvs: dict[tuple[int, int], int] = {}
    finals: list[list[tuple[int, int | None]]] = []
    for r in report.ranks:
        n, fin, left, n_left = _tally(r, sends, recvs)
        per_group.append(n)
        finals.append(fin)
        if left is not None:
            out.append(Finding("invariant:unfinished_collective", left.group, left.seq, [r.rank],
                               f"rank {r.rank} finished with {n_left} op(s) never completed, first {left.short()}"))
    for gname, members in groups.items():
        c = {m: per_group[m].get(gname, 0) for m in members}
        if len(set(c.values())) > 1:
            out.append(Finding("invariant:collective_counts", gname, max(c.values()), sorted(members),
                               f"ranks issued different numbers of collectives on {gname}: "
                               + ", ".join(f"rank {m}: {k}" for m, k in c.items())))
    for (a, b) in sorted(set(sends) | set(recvs)):
        if sends.get((a, b), 0) != recvs.get((a, b), 0):
            out.append(Finding("invariant:p2p_counts", "WORLD", 0, [a, b],
                               f"rank {a} sent {sends.get((a, b), 0)} message(s) to rank {b}, which received "
                               f"{recvs.get((a, b), 0)}"))
    out += _final_model_findings(scenario, finals, done)
    # custom joinables whose post hooks synchronise a value: every rank ends with the same
    for key in ("counter.max_count", "allreducer.post_hook_tensor"):
        vals = [r.observed.get(key) for r in report.ranks if key in r.observed]
        if len(vals) == w and len({repr(v) for v in vals}) > 1:
            out.append(Finding("invariant:joinable_sync", "WORLD", 0, list(range(w)), f"{key} differs across ranks: {vals}"))
    return out


_FINAL = "ddp.post_hook.broadcast_final_model"
_OP, _GROUP, _ORIGIN, _COMPLETED = (attrgetter(a) for a in ("op", "group", "origin", "completed"))


def _tally(r: RankResult, sends: dict[tuple[int, int], int],
           recvs: dict[tuple[int, int], int]) -> tuple[dict[str, int], list[tuple[int, int | None]], TraceEntry | None, int]:
    """One rank's trace for `invariant_findings`: its collectives per group, its final-model
    broadcasts (seq, root), its first op never completed and how many; its sends and receives
    counted into `sends` and `recvs`. A trace without p2p ops, as nearly every one is, is
    tallied with C-speed passes (the fuzzer checks every run's whole trace)."""
    trace = r.trace
    ops = set(map(_OP, trace))
    if "send" not in ops and "recv" not in ops:
        fin = [(e.seq, e.root) for e in compress(trace, map(_FINAL.__eq__, map(_ORIGIN, trace)))]
        if all(map(_COMPLETED, trace)):
            return Counter(map(_GROUP, trace)), fin, None, 0
        pending = [e for e in trace if not e.completed]
        return Counter(map(_GROUP, trace)), fin, pending[0], len(pending)
    n: dict[str, int] = {}
    fin = []
    left = None
    n_left = 0
    for e in trace:
        if not e.completed:
            n_left += 1
            left = left or e
        if e.op == "send":
            sends[(r.rank, e.peer)] = sends.get((r.rank, e.peer), 0) + 1  # type: ignore[index]
        elif e.op == "recv":
            recvs[(e.peer, r.rank)] = recvs.get((e.peer, r.rank), 0) + 1  # type: ignore[index]
        else:
            n[e.group] = n.get(e.group, 0) + 1
            if e.origin == _FINAL:
                fin.append((e.seq, e.root))
    return n, fin, left, n_left


def may_stop(scenario: Scenario, rank: int) -> bool:
    """Whether a `stop` step of the loop may apply to `rank`: it may then leave its loop with
    inputs left, as the scenario says (conservative: nested conditions are not looked at)."""
    return any(isinstance(st, StopStep) and (st.ranks is None or rank in st.ranks) for st in scenario.loop)


def _final_model_findings(scenario: Scenario, finals: list[list[tuple[int, int | None]]],
                          counts: list[int]) -> list[Finding]:
    """Every replica of the joined DDP models took the same final-model broadcast, rooted at
    a last joiner (one that ran the most iterations, `counts`): on the models' group, whose
    ranks all hold them (other ranks take none)."""
    j = scenario.join
    if j is None or not j.enabled or j.throw_on_early_termination:
        return []
    joined = [m for m in scenario.all_models() if m.name in j.joinables]
    if not joined or len({m.group for m in joined}) > 1:
        return []  # several groups: torch raises at Join's construction
    group = joined[0].group
    members = scenario.group_ranks(group)
    mine = [finals[m] for m in members]
    roots = {x[1] for f in mine for x in f}
    if any(not f for f in mine) or any(f != mine[0] for f in mine):
        return [Finding("invariant:ddp_final_model", group, 0, members,
                        f"DDP replicas did not all take the same final-model broadcast: {mine}")]
    if not roots or max(counts[m] for m in members) == 0:
        return []
    root = next(iter(roots))
    most = max(counts[m] for m in members)
    if root is not None and counts[root] != most:
        return [Finding("invariant:ddp_final_model", group, mine[0][0][0], [root],
                        f"final model broadcast from rank {root} ({counts[root]} inputs), not from a last joiner "
                        f"({most} inputs)")]
    return []


def _primary(findings: list[Finding]) -> Finding | None:
    for kind in PRIORITY:
        for f in findings:
            if f.kind == kind:
                return f
    for f in findings:
        if f.kind.startswith("invariant:"):
            return f
    return findings[0] if findings else None


def _signature(kind: str, outcome: str, report: Report, primary: Finding | None) -> str:
    origins: set[str] = set()
    if primary is not None:
        for r in primary.ranks:
            if 0 <= r < len(report.ranks):
                e = failing_entry(report, r)
                if e is not None:
                    origins.add(e.origin)
    return f"{kind}/{outcome}" + (f"/{'~'.join(sorted(origins))}" if origins else "")


def check_run(report: Report, scenario: Scenario, *, invariants: bool = True) -> Verdict:
    """Classify a run: failed when it did not complete, any finding was made, or an invariant broke."""
    wf = build_waitfor(report, scenario)
    findings = list(report.findings) + run_findings(report, scenario, wf)
    if invariants:
        findings += invariant_findings(report, scenario)
    return judge(report, findings, wf)


def passes(report: Report, scenario: Scenario, *, invariants: bool = True) -> bool:
    """``not check_run(report, scenario, invariants=invariants).failed``, without building
    what only a failure's verdict needs (the wait-for graph, the summary): the fuzzer asks
    this of every compressed run. A completed run has every rank completed
    (`overall_outcome`), so no rank is blocked or failed and `run_findings` finds nothing:
    it fails only by the engine's own findings or a broken invariant."""
    if report.outcome != "completed" or report.findings:
        return False
    return not (invariants and invariant_findings(report, scenario))


def judge(report: Report, findings: list[Finding], wf: WaitFor | None = None) -> Verdict:
    """The verdict on a run given all its findings: a scenario's (`check_run`), or a script's,
    whose report carries its findings already (`simdist.script.build`)."""
    failed = report.outcome != "completed" or bool(findings)
    primary = _primary(findings)
    if not failed:
        return Verdict(False, "ok", report.outcome, findings, "ok", "no failure", wf)
    kind = primary.kind if primary is not None else f"outcome_{report.outcome}"
    summary = f"{report.outcome}: {kind}" + (f" -- {primary.detail}" if primary is not None else "")
    return Verdict(True, kind, report.outcome, findings, _signature(kind, report.outcome, report, primary), summary, wf)
