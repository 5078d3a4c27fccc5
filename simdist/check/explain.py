"""Explanations in words, and the CLI hooks `annotate_report` / `explain_report`.

An explanation names, for each rank that is stuck or failed, the collective (op, per-group
sequence number, origin, size, group, the input it was issued at) and what every rank it
waits for was doing instead, e.g.::

    rank 1 waits in all_reduce #14 (DDP bucket 0, 4 B, group WORLD) issued at input 6;
    rank 0 left the Join context after its 5th input and its join hooks do not shadow
    this collective

then where the ranks' collective sequences first drifted apart, the deadlock core of the
wait-for graph, and hints naming the known failure family and its fix
(`simdist.check.hints`).
"""

from __future__ import annotations

import re

from simdist.check.classify import Verdict, check_run, failing_entry, invariant_findings, run_findings
from simdist.check.hints import hints, joined
from simdist.check.waitfor import P2P_OPS, WaitFor, collective_index, group_members
from simdist.report import Finding, Report, TraceEntry
from simdist.scenario import Scenario
from simdist.vocab import CHECKER_KINDS, DTYPE_BYTES, MISMATCH_KINDS, ORIGINS, ROOTED_OPS

_CONSEQUENCE = re.compile(r"(blocks forever|aborts|paired silently, values mixed)")

_PHRASES = {
    "ddp.backward.bucket_allreduce": "DDP bucket {b}",
    "ddp.join_hook.bucket_allreduce": "DDP join hook's shadow of bucket {b}",
    "ddp.backward.unused_map_allreduce": "DDP unused-parameter map",
    "ddp.join_hook.unused_map_allreduce": "DDP join hook's shadow unused-parameter map",
    "ddp.pre_forward.requires_grad_sync": "DDP backward-sync flag",
    "ddp.join_hook.requires_grad_sync": "DDP join hook's backward-sync flag",
    "ddp.pre_forward.rebuild_buckets": "DDP bucket rebuild",
    "ddp.join_hook.rebuild_buckets": "DDP join hook's bucket rebuild",
    "ddp.pre_forward.find_common_rank": "DDP buffer-sync rank",
    "ddp.pre_forward.sync_buffers": "DDP buffer broadcast",
    "ddp.post_hook.find_common_rank": "DDP last-joiner vote",
    "ddp.post_hook.broadcast_final_model": "DDP final-model broadcast",
    "ddp.init.verify_params": "DDP constructor parameter check",
    "ddp.init.sync_module_states": "DDP constructor state broadcast",
    "join.notify_join_context.heartbeat": "Join heartbeat",
    "join.notify_join_context.throw_check": "Join throw check",
    "join.exit.count_nonjoined": "Join.__exit__ count of non-joined ranks",
    "join.exit.notify_terminate": "Join.__exit__ termination notice",
    "zero.step.broadcast_shard": "ZeRO shard broadcast {b}",
    "zero.join_hook.broadcast_shard": "ZeRO join hook's shadow shard broadcast {b}",
}


def fmt_bytes(n: int) -> str:
    if n < 1024:
        return f"{n} B"
    for unit in ("KiB", "MiB", "GiB"):
        n /= 1024  # type: ignore[assignment]
        if n < 1024 or unit == "GiB":
            return f"{n:.3g} {unit}"
    return f"{n} B"  # pragma: no cover


def ordinal(n: int) -> str:
    suffix = "th" if 10 <= n % 100 <= 20 else {1: "st", 2: "nd", 3: "rd"}.get(n % 10, "th")
    return f"{n}{suffix}"


def role(origin: str) -> str:
    """What a collective stands for, the same for a loop op and the join hook op shadowing it."""
    parts = origin.split(".")
    if parts[0] == "join" and parts[-1] in ("heartbeat", "count_nonjoined"):
        return "join.heartbeat"
    if parts[0] in ("ddp", "zero", "counter", "allreducer") and len(parts) == 3 and parts[1] in (
            "pre_forward", "backward", "join_hook", "step", "call", "main_hook"):
        return f"{parts[0]}.{parts[2]}"
    return origin


def _run_index(trace: list[TraceEntry], e: TraceEntry) -> int | None:
    """Position of `e` in the run of consecutive entries with its origin (bucket k, shard k);
    None when the loop's iterations are not known (a script's or a Flight Recorder dump's
    trace), as the run then spans iterations."""
    if e.phase == "loop" and e.iteration is None:
        return None
    try:
        i = next(k for k, x in enumerate(trace) if x is e)
    except StopIteration:
        return 0
    b = 0
    while i - 1 - b >= 0 and trace[i - 1 - b].origin == e.origin and trace[i - 1 - b].iteration == e.iteration:
        b += 1
    return b


def origin_phrase(report: Report, rank: int, e: TraceEntry) -> str:
    if e.origin.startswith("user."):
        return f"user collective '{e.origin[5:]}'" if e.op not in P2P_OPS else f"user {e.op} '{e.origin[5:]}'"
    tmpl = _PHRASES.get(e.origin)
    if tmpl is None:
        return ORIGINS.get(e.origin, e.origin)
    b = _run_index(report.ranks[rank].trace, e)
    return tmpl.replace(" {b}", "") if b is None else tmpl.format(b=b)


def where(report: Report, rank: int, e: TraceEntry) -> str:
    n = report.ranks[rank].inputs_processed
    if e.phase == "loop" and e.iteration is not None:
        return f"issued at input {e.iteration + 1}"
    if e.phase == "join_exit":
        return f"issued in Join.__exit__ (shadowing after its {ordinal(n)} input)" if n else \
            "issued in Join.__exit__ (shadowing, it had no input)"
    if e.phase == "after":
        return "issued after its loop"
    if e.phase == "init":
        return "issued during setup"
    return ""  # in the loop, at an input the recorder does not know (a script, a Flight Recorder dump)


def describe(report: Report, rank: int, e: TraceEntry) -> str:
    """E.g. ``all_reduce #14 (DDP bucket 0, 4 KiB, group WORLD) issued at input 6``."""
    if e.op in P2P_OPS:
        peer = f"{'to' if e.op == 'send' else 'from'} rank {e.peer}"
        size = fmt_bytes(e.numel * DTYPE_BYTES.get(e.dtype, 4))
        return f"{e.op} {peer} ({origin_phrase(report, rank, e)}, {size}) {where(report, rank, e)}".rstrip()
    size = fmt_bytes(e.numel * DTYPE_BYTES.get(e.dtype, 4))
    extra = f", root {e.root}" if e.root is not None and e.op in ROOTED_OPS else ""
    extra += f", {e.reduce_op}" if e.reduce_op not in (None, "sum") else ""
    dt = f" {e.dtype}" if e.dtype != "float32" else ""
    text = f"{e.op} #{e.seq} ({origin_phrase(report, rank, e)}, {size}{dt}{extra}, group {e.group})"
    return f"{text} {where(report, rank, e)}".rstrip()


def shadowed(scenario: Scenario, origin: str) -> bool:
    """Would a joined rank's join hooks issue a counterpart of this collective?"""
    j = scenario.join
    if j is None or not j.enabled:
        return False
    comp = origin.split(".")[0]
    if comp == "join":
        return True
    kinds = set()
    for name in j.joinables:
        try:
            kinds.add(scenario.joinable_kind(name))
        except KeyError:
            pass
    return comp in kinds


def rank_state(report: Report, scenario: Scenario, m: int, about: TraceEntry | None = None) -> str:
    r = report.ranks[m]
    n = r.inputs_processed
    inputs = f"its {ordinal(n)} input" if n else "no input at all"
    if r.status == "completed":
        if joined(scenario):
            s = f"rank {m} left the Join context after {inputs}"
            if about is not None and not shadowed(scenario, about.origin):
                s += " and its join hooks do not shadow this collective"
            elif about is not None:
                s += " (its join hooks stopped shadowing when Join.__exit__ counted no non-joined rank)"
            return s
        tail = " and exited" if scenario.on_finish == "exit" else " and stays alive without communicating"
        return f"rank {m} finished its loop after {inputs}{tail}"
    if r.status == "hang" and r.blocked_in is not None:
        return f"rank {m} is itself blocked in {describe(report, m, r.blocked_in)}"
    if r.error is not None:
        first = r.error.message.strip().splitlines()[0] if r.error.message.strip() else ""
        return f"rank {m} died after {inputs} ({r.error.type}: {first})"
    return f"rank {m} is {r.status}"


def divergence(report: Report, scenario: Scenario, group: str) -> str | None:
    """Where the members' collective sequences on `group` first stop pairing like with like."""
    index = collective_index(report)
    members = group_members(scenario, report, group)
    last = max((s for m in members for (g, s) in index[m] if g == group), default=0)
    for seq in range(1, last + 1):
        es = {m: index[m].get((group, seq)) for m in members}
        present = [e for e in es.values() if e is not None]
        roles = {role(e.origin) for e in present}
        fps = {e.fingerprint() for e in present}
        if len(present) == len(members) and len(roles) == 1 and len(fps) == 1:
            continue
        parts = []
        for m, e in es.items():
            if e is None:
                n = max((s for (g, s) in index[m] if g == group), default=0)
                parts.append(f"rank {m}: nothing (its last collective on {group} is #{n})")
            else:
                parts.append(f"rank {m}: {describe(report, m, e)}")
        return f"on group {group} the ranks' collective sequences first drift apart at #{seq}: " + "; ".join(parts)
    return None


def explain_verdict(report: Report, scenario: Scenario, verdict: Verdict) -> list[str]:
    if not verdict.failed:
        return []
    lines = [f"verdict: {report.outcome} ({verdict.kind})"]
    wf: WaitFor | None = verdict.waitfor
    g = wf.graph if wf is not None else None
    groups: list[str] = []
    for r in report.ranks:
        e = failing_entry(report, r.rank)
        if r.status == "hang" and r.blocked_in is not None and g is not None:
            e = r.blocked_in
            waits = []
            for m in sorted(g.successors(r.rank)):
                reason = g.edges[r.rank, m]["reason"]
                if reason == "mismatch":
                    other = collective_index(report)[m].get((e.group, e.seq))
                    what = describe(report, m, other) if other is not None else "a different collective"
                    waits.append(f"rank {m} issued a different collective there: {what}")
                elif reason == "p2p":
                    waits.append(f"rank {m} never posted the matching {'send' if e.op == 'recv' else 'recv'}; "
                                 + rank_state(report, scenario, m, e))
                else:
                    waits.append(rank_state(report, scenario, m, e))
            lines.append(f"rank {r.rank} waits in {describe(report, r.rank, e)}" + ("; " + "; ".join(waits) if waits else ""))
            if e.group not in groups and e.op not in P2P_OPS:
                groups.append(e.group)
        elif r.status in ("error", "aborted") and r.error is not None:
            first = r.error.message.strip().splitlines()[0] if r.error.message.strip() else ""
            at = f" in {describe(report, r.rank, e)}" if e is not None else ""
            lines.append(f"rank {r.rank} failed{at}: {r.error.type}: {first}")
            if e is not None and e.group not in groups and e.op not in P2P_OPS:
                groups.append(e.group)
    for f in verdict.findings:
        if f.kind in MISMATCH_KINDS:
            m = _CONSEQUENCE.search(f.detail)
            index = collective_index(report)
            parts = []
            for r in f.ranks:
                e = index[r].get((f.group, f.seq)) if 0 <= r < len(index) else None
                if e is not None:
                    parts.append(f"rank {r}: {e.op}[{e.numel}] {e.dtype} ({origin_phrase(report, r, e)})")
            lines.append(f"{f.kind.replace('_', ' ')} at #{f.seq} on {f.group}"
                         + (f" ({m.group(1)})" if m else "") + ": " + "; ".join(parts))
            if f.group not in groups:
                groups.append(f.group)
        elif f.kind.startswith("invariant:"):
            lines.append(f"invariant broken ({f.kind[10:]}): {f.detail}")
    for grp in groups:
        d = divergence(report, scenario, grp)
        if d:
            lines.append(d)
    if wf is not None and wf.blocked:
        lines.append(waitfor_line(wf))
    lines.extend(hints(report, scenario, verdict))
    return lines


def waitfor_line(wf: WaitFor) -> str:
    """The wait-for graph in one sentence: a deadlock core only where blocked ranks wait on
    each other; a rank waiting on ranks that are not blocked is named as such."""
    parts = [f"wait-for graph: blocked ranks {wf.blocked}"]
    if wf.core:
        parts.append("deadlock core " + ", ".join(str(c) for c in wf.core) + " (ranks waiting on each other)")
    if wf.roots:
        who = f"rank {wf.roots[0]} waits" if len(wf.roots) == 1 else f"ranks {wf.roots} wait"
        on = sorted({m for r in wf.roots for m in wf.graph.successors(r)})
        parts.append(f"no cycle: {who} on ranks {on}, which are not blocked")
    if wf.culprits:
        parts.append(f"ranks {wf.culprits} will never issue what is needed")
    if wf.downstream:
        parts.append(f"ranks {wf.downstream} are blocked only because those are")
    return "; ".join(parts)


def explain_report(report: Report, scenario: Scenario) -> list[str]:
    """Human explanation lines for a report (empty when nothing failed)."""
    return explain_verdict(report, scenario, check_run(report, scenario))


def annotate_report(report: Report, scenario: Scenario) -> Verdict:
    """Add the checker's findings (hang, deadlock, p2p_unmatched, ...) and explanation notes to `report`."""
    verdict = check_run(report, scenario)
    have = {(f.kind, f.group, f.seq, tuple(f.ranks)) for f in report.findings}
    extra: list[Finding] = run_findings(report, scenario, verdict.waitfor) + invariant_findings(report, scenario)
    for f in extra:
        key = (f.kind, f.group, f.seq, tuple(f.ranks))
        if key not in have and (f.kind in CHECKER_KINDS or f.kind.startswith("invariant:")):
            report.findings.append(f)
            have.add(key)
    for line in explain_verdict(report, scenario, verdict):
        if line not in report.notes:
            report.notes.append(line)
    return verdict
