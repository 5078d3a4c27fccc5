"""Mismatches found in finished traces: what the engine reports while pairing, for runs that
had no engine (real Gloo, a job's Flight Recorder dumps).

The simulator's engine names a mismatch when it pairs the ranks' calls at one sequence
number of a group (`simdist.engine.gloo_bridge`). A finished trace holds the same
information wherever every member issued that sequence number: their calls differ, it is a
mismatch of the same kind, with the consequence Gloo's rules give it (`gloo_rules`) where
they know it. Reduce ops and roots that a recorder cannot see are None on every rank, so
they never differ here.
"""

from __future__ import annotations

from simdist.check.waitfor import group_members
from simdist.engine import gloo_bridge, gloo_rules
from simdist.report import Finding, Report
from simdist.scenario import Scenario
from simdist.vocab import P2P_OPS, ROOTED_OPS


def trace_mismatches(report: Report, scenario: Scenario | None) -> list[Finding]:
    """Every (group, sequence number) that all members issued with different calls, named as
    the engine names them."""
    index = [{(e.group, e.seq): e for e in r.trace if e.op not in P2P_OPS} for r in report.ranks]
    out: list[Finding] = []
    for group in sorted({g for ix in index for (g, _) in ix}):
        members = [m for m in group_members(scenario, report, group) if m < len(index)]
        for seq in sorted({s for m in members for (g, s) in index[m] if g == group}):
            entries = {m: index[m].get((group, seq)) for m in members}
            if any(e is None for e in entries.values()) or len({e.fingerprint() for e in entries.values()}) == 1:
                continue
            calls = [gloo_rules.CollectiveCall(m, e.op, e.numel, e.dtype, e.reduce_op, e.root)
                     for m, e in entries.items()]
            origins = [e.origin for e in entries.values()]
            out.append(gloo_bridge.mismatch_finding(group, seq, calls, origins, _consequence(report, calls, members)))
    return out


def _consequence(report: Report, calls: list[gloo_rules.CollectiveCall], members: list[int]
                 ) -> gloo_rules.MismatchVerdict | None:
    if report.backend != "gloo" or any(c.op in P2P_OPS or (c.op in ROOTED_OPS and c.root is None) for c in calls):
        return None  # NCCL's behaviour is not modelled; Gloo's for a rooted op needs its root
    try:
        return gloo_rules.classify_mismatch(calls, len(members), members=members)  # group-rank order (`group_members`)
    except (ValueError, KeyError):
        return None  # a dtype or op the rules do not model
