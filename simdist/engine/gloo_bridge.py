"""Connects the engine to the backend's pairing rules (`gloo_rules`), and names findings.

The rules themselves (what Gloo does when ranks issue different collectives at the same
sequence number) live in `gloo_rules`, derived from experiments on real Gloo. This module
only converts engine calls into the rule's input and the verdict into a checker finding.
"""

from __future__ import annotations

from simdist.engine import gloo_rules
from simdist.engine.calls import Call
from simdist.engine.values import Splits
from simdist.report import Finding
from simdist.vocab import ROOTED_OPS

_OK = gloo_rules.MismatchVerdict(kind="ok", aborting_ranks=[], detail="")


def classify(calls: list[Call], group_size: int, alike: bool = False) -> gloo_rules.MismatchVerdict:
    """What the backend does with these calls of one sequence number, one per member in
    group-rank order (Gloo's rings and trees follow it: a `new_group(ranks, sort_ranks=False)`
    group's need not be ascending). `alike`: the caller knows every fingerprint is the same
    (`Instance.alike`), so only an all_to_all's split sizes are left to compare."""
    c0 = calls[0]
    if alike and c0.op != "all_to_all":
        return _OK
    fp0 = (c0.op, c0.payload.numel, c0.payload.dtype, c0.reduce_op, c0.root)
    if all((c.op, c.payload.numel, c.payload.dtype, c.reduce_op, c.root) == fp0 for c in calls[1:]):
        return _OK if not _splits(calls) or _splits_agree(calls) else gloo_rules.classify_mismatch(
            rule_calls(calls), group_size, members=[c.rank for c in calls])
    if _splits_agree(calls):
        return _OK  # an all_to_all with uneven split sizes that every pair of ranks agrees on
    return gloo_rules.classify_mismatch(rule_calls(calls), group_size, members=[c.rank for c in calls])


def _splits(calls: list[Call]) -> list[Splits] | None:
    if calls[0].op != "all_to_all":
        return None
    s = [c.payload.meta for c in calls]
    return s if all(isinstance(x, Splits) for x in s) else None  # type: ignore[return-value]


def _splits_agree(calls: list[Call]) -> bool:
    """Whether what each rank sends to each other is what that one expects from it (Gloo's
    alltoallv exchanges exactly these counts); dtypes must agree too."""
    splits = _splits(calls)
    if splits is None or any(c.op != "all_to_all" or c.payload.dtype != calls[0].payload.dtype for c in calls):
        return False
    n = len(calls)
    return all(len(s.send) == n == len(s.recv) for s in splits) and all(
        splits[i].send[j] == splits[j].recv[i] for i in range(n) for j in range(n))


def rule_calls(calls: list[Call]) -> list[gloo_rules.CollectiveCall]:
    """Engine calls as the rule's input. Where any rank's all_to_all has uneven split sizes,
    every all_to_all with split sizes is Gloo's alltoallv (`gloo_rules.ALLTOALLV`, with its
    split sizes): gloo/alltoall.cc and alltoallv.cc build their slot from the same prefix
    (kAlltoallSlotPrefix) and post the same messages for even counts, so an alltoall pairs
    with an alltoallv message by message (torch 2.13, measured: even split sizes given meet
    none given and complete)."""
    v = any(_uneven(c) for c in calls)
    return [gloo_rules.CollectiveCall(c.rank, gloo_rules.ALLTOALLV, c.payload.numel, c.payload.dtype, c.reduce_op,
                                      c.root, (c.payload.meta.send, c.payload.meta.recv))  # type: ignore[union-attr]
            if v and c.op == "all_to_all" and isinstance(c.payload.meta, Splits) else
            gloo_rules.CollectiveCall(c.rank, c.op, c.payload.numel, c.payload.dtype, c.reduce_op, c.root)
            for c in calls]


def _uneven(c: Call) -> bool:
    """Whether this all_to_all's split sizes are uneven (an alltoall cannot post its messages)."""
    s = c.payload.meta
    return c.op == "all_to_all" and isinstance(s, Splits) and len(set(s.send) | set(s.recv)) > 1


def absent_outcomes(calls: list[Call], members: list[int], gone: dict[int, float],
                    missing: list[int]) -> gloo_rules.MismatchVerdict:
    """Each posted rank's outcome (`rank_outcomes`; for one left waiting, on whom: `waits_on`)
    of a collective of the group `members` (group-rank order) that members never posted:
    `gone` ended their processes (member -> when),
    `missing` are alive but have not posted it (judged as posting a different kind of
    collective: a separate Gloo slot, so they exchange nothing).

    Gloo fails only the ranks whose own messages involve a gone member; the others complete
    (a broadcast's rank fed by the root finishes without a sibling that exited). A rank that
    posted at or before the instant a peer ended posted all its messages before that peer's
    sockets closed (a process takes milliseconds to unwind): its posts to the peer are
    accepted and only its wait fails; one that posted later fails as it posts."""
    posted = rule_calls(calls)
    # a stand-in of a kind no posted rank issued: a missing barrier must not "match" posted ones
    # (ranks 0 and 2 in a barrier while rank 1 waits in a recv time out on Gloo, they do not pass)
    # (posted calls of all three kinds leave none: the stand-in is then an op Gloo's rules do not
    # model, which `classify_mismatch` judges as the conservative hang of different slots)
    kind = next((op for op in ("barrier", "all_gather", "all_reduce") if all(c.op != op for c in posted)), "absent")
    entries = posted + [gloo_rules.CollectiveCall(m, kind) for m in missing]
    unaware = {c.rank: frozenset(d for d, t in gone.items() if c.entry.t_issue <= t) for c in calls}
    return gloo_rules.classify_mismatch(entries, len(members), exited=set(gone), unaware=unaware, members=members)


def mismatch_kind(calls: list[gloo_rules.CollectiveCall]) -> str:
    """The checker's name for the first field on which the ranks' calls disagree."""
    first = calls[0]
    for fld, kind in (("op", "op_mismatch"), ("numel", "size_mismatch"), ("dtype", "dtype_mismatch"),
                      ("reduce_op", "reduce_op_mismatch")):
        if any(getattr(c, fld) != getattr(first, fld) for c in calls[1:]):
            return kind
    return "root_mismatch"


def mismatch_finding(group: str, seq: int, calls: list[gloo_rules.CollectiveCall], origins: list[str],
                     verdict: gloo_rules.MismatchVerdict | None) -> Finding:
    """The finding for ranks' different calls at one sequence number (global ranks in `calls`);
    `verdict` says what the backend does with them, None where that is not known."""
    parts = "; ".join(
        f"rank {c.rank}: {c.op}[{c.numel}] {c.dtype}"
        + (f" {c.reduce_op}" if c.reduce_op else "")
        + (f" root={c.root}" if c.root is not None and c.op in ROOTED_OPS else "")
        + f" ({origin})"
        for c, origin in zip(calls, origins, strict=True)
    )
    consequence = {"silent": " paired silently, values mixed", "hang": " blocks forever", "abort": " aborts",
                   "ok": ""}[verdict.kind] if verdict is not None else ""
    detail = f"#{seq} on {group}{consequence}: {parts}"
    if verdict is not None and verdict.detail:
        detail += f" -- {verdict.detail}"
    return Finding(kind=mismatch_kind(calls), group=group, seq=seq, ranks=[c.rank for c in calls], detail=detail)


def finding(group: str, seq: int, calls: list[Call], verdict: gloo_rules.MismatchVerdict) -> Finding:
    """The engine's finding for mismatched calls it paired."""
    return mismatch_finding(group, seq, rule_calls(calls), [c.entry.origin for c in calls], verdict)
