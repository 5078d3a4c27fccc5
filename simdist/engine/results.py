"""What each rank's output holds after a matched collective, from every rank's input.

Values follow what the backend computes (`simdist.engine.values`: Gloo's ring order for
reductions, in-place partial sums on a reduce's non-roots, uneven all_to_all splits).
"""

from __future__ import annotations

import dataclasses

from simdist.engine.calls import Call
from simdist.engine.values import (
    Payload,
    alltoall_payload,
    chunk_payload,
    concat_payloads,
    reduce_partial,
    reduce_payloads,
)


def collective_results(calls: list[Call]) -> dict[int, Payload]:
    """What each rank's output holds after a matched collective, computed from every rank's input.

    Each rank computes with its own view (its dtype, its reduce op, its root), which is
    how a backend that pairs mismatched calls mixes their values. A well-formed
    all_reduce/broadcast/all_gather gives every rank the same result, computed once.
    """
    ranks = [c.rank for c in calls]
    c0 = calls[0]
    if c0.op in ("all_reduce", "broadcast", "all_gather") and all(
        c.op == c0.op and c.payload.dtype == c0.payload.dtype and c.reduce_op == c0.reduce_op and c.root == c0.root
        for c in calls
    ):
        return dict.fromkeys(ranks, _result_for(c0, calls, ranks))
    return {c.rank: _result_for(c, calls, ranks) for c in calls}


def _result_for(c: Call, calls: list[Call], ranks: list[int]) -> Payload:
    n = len(calls)
    dtype = c.payload.dtype
    parts = [x.payload.reinterpret(dtype) if x.payload.dtype != dtype else x.payload for x in calls]
    op = c.op
    if op == "all_reduce":
        return reduce_payloads(parts, c.reduce_op or "sum", dtype, c.payload.numel)
    if op == "broadcast":
        src = next((x for x in calls if x.rank == c.root), c)
        res = dataclasses.replace(src.payload)  # the root's tensor, meta (e.g. bucket layout) included
        return res.reinterpret(dtype) if res.dtype != dtype else res
    if op == "all_gather":
        return concat_payloads(parts, dtype)
    if op == "gather":
        return concat_payloads(parts, dtype) if c.rank == c.root else Payload.unknown(0, dtype)
    if op == "reduce":
        if c.rank == c.root:
            return reduce_payloads(parts, c.reduce_op or "sum", dtype, c.payload.numel, ring="reduce")
        return reduce_partial(parts, c.reduce_op or "sum", dtype, ranks.index(c.rank))
    if op == "reduce_scatter":
        full = reduce_payloads(parts, c.reduce_op or "sum", dtype, c.payload.numel)
        return chunk_payload(full, ranks.index(c.rank), n)
    if op == "scatter":
        src = next((x for x in calls if x.rank == c.root), c)
        return chunk_payload(src.payload, ranks.index(c.rank), n)
    if op == "all_to_all":
        return alltoall_payload(parts, ranks.index(c.rank), dtype)
    return Payload.unknown(0, dtype)  # barrier
