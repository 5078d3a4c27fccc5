"""What each rank's output holds after a matched collective, from every rank's input.

Values follow what the backend computes (`simdist.engine.values`: Gloo's ring order for
reductions, in-place partial sums on a reduce's non-roots, uneven all_to_all splits).
"""

from __future__ import annotations

import numpy as np

from simdist.engine import gloo_bridge, gloo_rules
from simdist.engine.calls import Call
from simdist.engine.values import (
    NP_DTYPES,
    Payload,
    Splits,
    alltoall_payload,
    chunk_payload,
    concat_payloads,
    reduce_partial,
    reduce_payloads,
)
from simdist.errors import LimitError
from simdist.vocab import (
    FLOAT_DTYPES,
    REDUCING_OPS,
    TORCH_DTYPE_NAMES,
    gloo_empty_is_local,
    gloo_refusal,
)


def gloo_avg_error(c: Call) -> str | None:
    """The error Gloo's AVG raises for this rank's call, None where it divides.

    ProcessGroupGloo runs AVG as SUM followed by an in-place ``tensor /= size`` on each rank
    that asked for AVG (root or not, for reduce). For an integer or bool tensor torch's
    true division makes a Float that cannot be cast back, so that step raises: the work
    fails at ``wait()`` (and its future), after the collective went over the wire and the
    tensor holds the plain SUM (measured on torch 2.13, 2 and 3 ranks).
    """
    if c.op not in REDUCING_OPS or c.reduce_op != "avg" or c.payload.dtype in FLOAT_DTYPES:
        return None
    name = TORCH_DTYPE_NAMES.get(c.payload.dtype)
    return None if name is None else f"result type Float can't be cast to the desired output type {name}"


# Gloo's checks of an all_to_all's sizes as it runs (torch 2.13's wheel names its build path):
# alltoallv's own block sent and received, alltoall's input and output
_GLOO_SRC = "[enforce fail at /__w/pytorch/pytorch/third_party/gloo/gloo/"
ALLTOALLV_OWN_BLOCK = f"{_GLOO_SRC}alltoallv.cc:138] inLengthPerRank[myRank] == outLengthPerRank[myRank]. "
ALLTOALL_SIZES = f"{_GLOO_SRC}alltoall.cc:30] in->size == out->size. "


def gloo_local_error(c: Call, members: list[int] | None = None) -> str | None:
    """The error Gloo raises for this rank's call before it exchanges anything, None if none.

    ProcessGroupGloo picks the reduction function (``toFunction``) on its worker thread just
    before it calls into gloo; a bitwise op on a floating tensor has none and raises there
    (``Cannot use ReduceOp.BAND with non-integral dtype``): the work fails at ``wait()``, the
    tensor is untouched and the rank never joins the wire, so peers that did wait for its
    messages (measured on torch 2.13). A dtype Gloo has no kernel for (int16) fails the same
    way, at ``wait()``, on every collective but barrier: "Invalid scalar type"; and so does
    PREMUL_SUM, NCCL's alone ("Cannot use ReduceOp.PREMUL_SUM with Gloo"). After those, an
    all_to_all's sizes fail Gloo's enforce before any message (measured): alltoallv's (split
    sizes given) where the rank sends itself another count than it receives from itself,
    alltoall's where input and output differ in size (`members`: the group, for the split)."""
    refused = gloo_refusal(c.op, c.reduce_op, c.payload.dtype)
    s = c.payload.meta
    if refused is not None or c.op != "all_to_all" or not isinstance(s, Splits) or members is None:
        return refused
    if not s.given:
        return ALLTOALL_SIZES if sum(s.send) != sum(s.recv) else None
    me = members.index(c.rank)
    return ALLTOALLV_OWN_BLOCK if s.send[me] != s.recv[me] else None


def gloo_exchanges_nothing(c: Call) -> bool:
    """Whether Gloo completes this rank's call without the wire: a zero-element call of an op
    in `simdist.vocab.GLOO_EMPTY_IS_LOCAL`. It still takes the group's next tag (its sequence number), so a
    peer that posted a non-empty call there waits for messages that never come, and ranks
    that issue it unevenly fall out of step (PowerSGD's all-reduce of a bucket's uncompressed
    tensors is empty when every tensor of the bucket is compressed)."""
    return gloo_empty_is_local(c.op, c.payload.numel)


def collective_results(calls: list[Call], gloo: bool = True, alike: bool = False) -> dict[int, Payload]:
    """What each rank's output holds after a matched collective, computed from every rank's input.

    Each rank computes with its own view (its dtype, its reduce op, its root), which is
    how a backend that pairs mismatched calls mixes their values. A well-formed
    all_reduce/broadcast/all_gather gives every rank the same result, computed once.
    `gloo`: a rank whose AVG Gloo cannot divide keeps the SUM (`gloo_avg_error`). `alike`:
    the caller knows the calls' fingerprints are all the same (`Instance.alike`).
    """
    ranks = [c.rank for c in calls]
    c0 = calls[0]
    alike = alike or all(c.op == c0.op and c.payload.dtype == c0.payload.dtype and c.reduce_op == c0.reduce_op
                         and c.root == c0.root and c.payload.numel == c0.payload.numel for c in calls)
    if c0.op in ("all_reduce", "broadcast", "all_gather") and alike:
        return dict.fromkeys(ranks, _result_for(c0, calls, ranks, gloo))
    if gloo and (any(c.payload.numel != c0.payload.numel for c in calls) or _ops_mix(calls)):  # else: reinterpreted below
        mixed = _mixed_bytes(calls)
        if mixed is not None:
            return mixed
    return {c.rank: _result_for(c, calls, ranks, gloo) for c in calls}


def _ops_mix(calls: list[Call]) -> bool:
    """An all_reduce whose ranks reduce with different functions (SUM next to MAX): Gloo's ring
    reduces each segment with its owner's function and copies it verbatim to everyone, so all
    ranks get one patchwork, not each its own op's result (torch 2.13, 3 ranks, rank 0 MAX).
    AVG is SUM on the wire (divided locally after), so SUM next to AVG is no mix."""
    return calls[0].op == "all_reduce" and len({"sum" if c.reduce_op == "avg" else c.reduce_op for c in calls}) > 1


def _mixed_bytes(calls: list[Call]) -> dict[int, Payload] | None:
    """Calls of different sizes that Gloo pairs, with every rank's exact input known (a
    script's tensors): what each rank's tensor holds, from Gloo's byte-level ring
    (`gloo_rules.mixed_result`). A rank whose result reads Gloo's uninitialised scratch
    memory, or that does not finish, gets an unknown payload. None: not computable here
    (inputs not explicit, too large, or a dtype the byte model lacks)."""
    if any(not c.payload.exact or c.payload.dtype == "bfloat16" for c in calls):
        return None
    arrays = {c.rank: c.payload.array() for c in calls}
    if any(a is None for a in arrays.values()):
        return None
    try:
        res = gloo_rules.mixed_result(gloo_bridge.rule_calls(calls), len(calls),  # calls: group-rank order
                                      {r: a.tolist() for r, a in arrays.items()},  # type: ignore[union-attr]
                                      members=[c.rank for c in calls])
    except (ValueError, KeyError, NotImplementedError, LimitError):
        return None  # too large to model byte by byte (simdist.limits), or a case the model lacks
    out = {}
    for c in calls:
        vals, p = res.get(c.rank), c.payload
        if vals is None or any(v is None for v in vals):
            out[c.rank] = Payload.unknown(p.numel, p.dtype)
        else:
            out[c.rank] = Payload.from_array(np.asarray(vals, dtype=NP_DTYPES[p.dtype]), p.dtype, exact=True)
    return out


def _result_for(c: Call, calls: list[Call], ranks: list[int], gloo: bool) -> Payload:
    dtype = c.payload.dtype
    op = c.op
    if op == "broadcast":  # first: the commonest, and it needs no one's input but the root's
        src = next((x for x in calls if x.rank == c.root), c)
        res = src.payload  # the root's tensor, meta (e.g. bucket layout) included: payloads are never mutated
        return res.reinterpret(dtype) if res.dtype != dtype else res
    n = len(calls)
    red = "sum" if gloo and gloo_avg_error(c) is not None else c.reduce_op or "sum"
    parts = [x.payload.reinterpret(dtype) if x.payload.dtype != dtype else x.payload for x in calls]
    if op == "all_reduce":
        return reduce_payloads(parts, red, dtype, c.payload.numel)
    if op == "all_gather":
        return concat_payloads(parts, dtype)
    if op == "gather":
        return concat_payloads(parts, dtype) if c.rank == c.root else Payload.unknown(0, dtype)
    if op == "reduce":
        if c.rank == c.root:
            return reduce_payloads(parts, red, dtype, c.payload.numel, ring="reduce")
        return reduce_partial(parts, red, dtype, ranks.index(c.rank))
    if op == "reduce_scatter":
        full = reduce_payloads(parts, red, dtype, c.payload.numel)
        return chunk_payload(full, ranks.index(c.rank), n)
    if op == "scatter":
        src = next((x for x in calls if x.rank == c.root), c)
        return chunk_payload(src.payload, ranks.index(c.rank), n)
    if op == "all_to_all":
        return alltoall_payload(parts, ranks.index(c.rank), dtype)
    return Payload.unknown(0, dtype)  # barrier
