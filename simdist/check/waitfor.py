"""The wait-for graph of a run that did not complete, and its deadlock core.

Nodes are ranks; an edge ``r -> m`` means "rank r cannot proceed until rank m does
something": r is blocked in collective #s of group g and m has not issued #s (reason
``missing``) or issued a different collective there (reason ``mismatch``), or r waits in a
recv/send whose partner m never posted the matching op (reason ``p2p``).

As MUST does, the graph is then cut down to the ranks the others' waiting comes from:
among blocked ranks, the sink strongly connected components (no edge to another blocked
component). A sink that is a real cycle (ranks waiting on each other) is a *deadlock core*;
a sink that is one rank waiting on ranks that are not blocked (finished, exited: the
*culprits*) is a *root* -- a lone waiting rank, not a deadlock. A rank in neither is blocked
only because a core or root rank is. Drawing (DOT, PNG, SVG) is `simdist.check.drawing`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import networkx as nx

from simdist.report import Report, TraceEntry
from simdist.scenario import Scenario
from simdist.vocab import P2P_OPS


def collective_index(report: Report) -> list[dict[tuple[str, int], TraceEntry]]:
    """Per rank: (group, seq) -> the collective entry (p2p excluded: it has its own counter)."""
    return [{(e.group, e.seq): e for e in r.trace if e.op not in P2P_OPS} for r in report.ranks]


def group_members(scenario: Scenario | None, report: Report, group: str) -> list[int]:
    if scenario is not None:
        try:
            return scenario.group_ranks(group)
        except KeyError:
            pass
    return list(range(report.world_size or len(report.ranks)))


def _p2p_partner_posted(report: Report, rank: int, entry: TraceEntry) -> bool:
    """Did the peer post the op that pairs with `rank`'s k-th send/recv to/from it (FIFO)?"""
    peer = entry.peer
    if peer is None or not 0 <= peer < len(report.ranks):
        return False
    mine = [e for e in report.ranks[rank].trace if e.op == entry.op and e.peer == peer]
    k = next((i for i, e in enumerate(mine) if e is entry), len(mine) - 1)
    want = "recv" if entry.op == "send" else "send"
    theirs = [e for e in report.ranks[peer].trace if e.op == want and e.peer == rank]
    return len(theirs) > k


@dataclass
class _Posted:
    """Who posted collective #seq of a group, and with which fingerprint: worked out once
    per collective, not once per blocked rank (1,023 ranks blocked in one collective of
    1,024 would otherwise compare fingerprints a million times)."""

    members: list[int]
    missing: set[int]
    by_fingerprint: dict[tuple, set[int]]
    position: dict[int, int]  # member -> its place in `members`

    @classmethod
    def of(cls, members: list[int], index: list[dict[tuple[str, int], TraceEntry]], e: TraceEntry) -> _Posted:
        missing: set[int] = set()
        by_fp: dict[tuple, set[int]] = {}
        for m in members:
            other = index[m].get((e.group, e.seq)) if m < len(index) else None
            if other is None:
                missing.add(m)
            else:
                by_fp.setdefault(other.fingerprint(), set()).add(m)
        return cls(members, missing, by_fp, {m: i for i, m in enumerate(members)})

    def others_than(self, fingerprint: tuple) -> list[int]:
        """Members that did not post this collective with `fingerprint`, in member order."""
        same = self.by_fingerprint.get(fingerprint, set())
        if len(same) * 2 < len(self.members):
            return [m for m in self.members if m not in same]
        others = set(self.missing).union(*(ms for fp, ms in self.by_fingerprint.items() if fp != fingerprint))
        return sorted(others, key=self.position.__getitem__)


@dataclass
class WaitFor:
    """The graph plus what was derived from it."""

    graph: nx.DiGraph
    blocked: list[int]
    core: list[list[int]] = field(default_factory=list)  # sink SCCs that are cycles: the deadlock cores
    roots: list[int] = field(default_factory=list)  # sink ranks waiting only on ranks that are not blocked
    culprits: list[int] = field(default_factory=list)  # non-blocked ranks the core or roots wait on

    @property
    def cycle(self) -> bool:
        """True when blocked ranks wait on each other (a deadlock core exists)."""
        return bool(self.core)

    @property
    def downstream(self) -> list[int]:
        """Blocked ranks that are neither in a core nor roots: blocked only because those are."""
        first = {r for c in self.core for r in c} | set(self.roots)
        return [r for r in self.blocked if r not in first]

    def to_dict(self) -> dict[str, Any]:
        return {
            "nodes": [{"rank": n, **{k: v for k, v in d.items() if k != "entry"}} for n, d in sorted(self.graph.nodes(data=True))],
            "edges": [{"from": a, "to": b, **d} for a, b, d in sorted(self.graph.edges(data=True), key=lambda x: (x[0], x[1]))],
            "blocked": self.blocked,
            "core": self.core,
            "roots": self.roots,
            "culprits": self.culprits,
        }


def build_waitfor(report: Report, scenario: Scenario | None = None) -> WaitFor:
    g = nx.DiGraph()
    for r in report.ranks:
        g.add_node(r.rank, status=r.status, inputs=r.inputs_processed,
                   blocked_in=r.blocked_in.short() if r.blocked_in is not None else None, entry=r.blocked_in)
    blocked = [r.rank for r in report.ranks if r.status == "hang" and r.blocked_in is not None]
    index = collective_index(report) if blocked else []
    instances: dict[tuple[str, int], _Posted] = {}
    for rank in blocked:
        e = report.ranks[rank].blocked_in
        assert e is not None
        if e.op in P2P_OPS:
            if e.peer is not None and e.peer in g and not _p2p_partner_posted(report, rank, e):
                g.add_edge(rank, e.peer, reason="p2p", group=e.group, seq=e.seq, op=e.op)
            continue
        inst = instances.get((e.group, e.seq))
        if inst is None:
            inst = instances[(e.group, e.seq)] = _Posted.of(group_members(scenario, report, e.group), index, e)
        for m in inst.others_than(e.fingerprint()):
            if m != rank:
                reason = "missing" if m in inst.missing else "mismatch"
                g.add_edge(rank, m, reason=reason, group=e.group, seq=e.seq, op=e.op)
    wf = WaitFor(graph=g, blocked=blocked)
    if not blocked:
        return wf
    cond = nx.condensation(g.subgraph(blocked))
    sinks = [sorted(cond.nodes[c]["members"]) for c in cond.nodes if cond.out_degree(c) == 0]
    wf.core = sorted(c for c in sinks if len(c) > 1 or g.has_edge(c[0], c[0]))
    wf.roots = sorted(c[0] for c in sinks if len(c) == 1 and not g.has_edge(c[0], c[0]))
    first = {r for c in wf.core for r in c} | set(wf.roots)
    wf.culprits = sorted({b for a in first for b in g.successors(a) if b not in blocked})
    return wf
