"""What the real Gloo backend does when ranks issue mismatched collectives.

Rule (derived from gloo's source, checked against torch 2.13.0+cpu on real processes;
see docs/gloo-mismatch.md and bench/gloo_mismatch_probe.py):

1. ProcessGroupGloo gives every collective the next per-group tag (``collectiveCounter_``),
   and gloo derives the message *slot* from ``(collective prefix, tag)``: all_reduce uses
   ``kAllreduceSlotPrefix``, broadcast ``kBroadcastSlotPrefix``, all_gather
   ``kAllgatherSlotPrefix``, barrier ``kBarrierSlotPrefix``, ... (gloo/types.h); p2p
   send/recv use the bare user tag. Two *different kinds* of collective at the same
   sequence position therefore never exchange a single byte: every rank that needs a
   message from a rank doing the other kind blocks until the PG timeout.

2. Within one slot, the tcp transport matches messages per (sender, receiver) pair in
   FIFO order: the k-th ``send`` from A to B pairs with the k-th ``recv`` B posted
   from A, whatever their sizes (gloo/transport/tcp/pair.cc: ``localPendingSend_`` /
   ``localPendingRecv_`` deques, NOTIFY_SEND_READY / NOTIFY_RECV_READY rendezvous).
   When the data arrives, the receiver's I/O thread checks
   ``GLOO_ENFORCE_LE(op.preamble.length, op.nbytes)``:

   * message longer than the posted receive: ``gloo::EnforceNotMet`` on the I/O
     thread, uncaught, ``std::terminate`` -> the *receiver* dies with SIGABRT
     (``what(): ... op.preamble.length <= op.nbytes. 8 vs 4``). Its peers then get
     ``Connection reset/closed by peer`` on anything pending with it;
   * message shorter or equal: the receive completes silently, only ``length`` bytes
     are written, the rest of the target (often gloo's *uninitialised* scratch
     buffer) is used as is;
   * a receive with no k-th send (or a send with no k-th receive): that rank
     blocks until the PG timeout (``Timed out waiting ...ms for recv/send``).

3. So the outcome depends only on each rank's *message schedule* (which peer, which
   order, how many bytes per message), which each rank computes from its *own*
   arguments (numel, element size, root, group size). This module re-executes the
   gloo algorithms that ProcessGroupGloo uses on CPU (ring all_reduce with
   ``2*W``-or-more segments and 1 MiB max segment, binomial-tree broadcast, ring
   all_gather with half-chunks, dissemination barrier) as message programs, matches
   them as in (2), and reports the result. Same schedule + same bytes = "silent"
   (values mixed: each rank reduces the bytes it receives as *its own* dtype with
   *its own* reduce op, see :func:`mixed_result`).

Not modelled (reduce, gather, scatter, reduce_scatter, all_to_all): identical calls are
"ok", a different kind on the other side is "hang" (rule 1), same kind with different
arguments is reported conservatively as "hang" with a detail saying it is unmodelled.
"""

from __future__ import annotations

import math
import struct
from dataclasses import dataclass, field
from typing import Literal

from simdist.vocab import P2P_OPS, REDUCING_OPS, ROOTED_OPS, dtype_bytes

__all__ = [
    "CollectiveCall",
    "MismatchVerdict",
    "classify_mismatch",
    "mixed_result",
    "MODELLED_OPS",
]


#: Ops whose gloo message schedule is re-executed here.
MODELLED_OPS = frozenset({"all_reduce", "broadcast", "all_gather", "barrier", "send", "recv"})

# gloo::AllreduceOptionsImpl::kMaxSegmentSize (gloo/allreduce.h)
_MAX_SEGMENT_BYTES = 1024 * 1024


@dataclass(frozen=True)
class CollectiveCall:
    """One rank's call at a given per-group sequence position.

    ``rank`` is the rank within the group (0..W-1) or the global rank (see
    :func:`classify_mismatch`). ``root`` is the broadcast/reduce root or, for
    ``send``/``recv``, the peer, in the same numbering. ``numel`` is the number of
    elements of the (input) tensor; for all_gather the per-rank input.
    """

    rank: int
    op: str
    numel: int = 0
    dtype: str = "float32"
    reduce_op: str | None = None
    root: int | None = None


RankOutcome = Literal["ok", "hang", "abort", "peer_error"]


@dataclass
class MismatchVerdict:
    """Outcome of one sequence position on one group.

    kind:
      * ``ok``: all calls identical (up to irrelevant fields), normal collective;
      * ``silent``: calls differ but every rank completes; values are mixed
        (see :func:`mixed_result`);
      * ``hang``: no rank aborts but at least one rank blocks until the PG timeout
        and raises ``RuntimeError: ... Timed out waiting <T>ms for recv/send operation``.
        Ranks whose own schedule was fully matched may still complete (``rank_outcomes``);
      * ``abort``: at least one rank receives a message larger than the receive it
        posted and dies with SIGABRT (``aborting_ranks``); ranks with an operation
        pending on an aborted rank get ``RuntimeError`` (connection reset/closed by
        peer) almost immediately (``peer_error``); others complete or hang.
    """

    kind: Literal["ok", "silent", "hang", "abort"]
    aborting_ranks: list[int] = field(default_factory=list)
    detail: str = ""
    rank_outcomes: dict[int, RankOutcome] = field(default_factory=dict)
    modelled: bool = True
    #: for each hanging rank, the operation its timeout error names ("recv"/"send" ...)
    blocked_on: dict[int, str] = field(default_factory=dict)


def _esize(dtype: str) -> int:
    try:
        return dtype_bytes(dtype.removeprefix("torch."))
    except KeyError:
        raise ValueError(f"unknown dtype {dtype!r}") from None


def _elements(c: CollectiveCall) -> tuple[int, int]:
    """(elements, element size) as gloo sees them (complex is viewed as real)."""
    d = c.dtype.removeprefix("torch.")
    if d in ("complex64", "complex128"):
        return c.numel * 2, _esize(d) // 2
    return c.numel, _esize(d)


# ---------------------------------------------------------------------------------------
# Message programs
# ---------------------------------------------------------------------------------------
# A program is a list of steps executed in order by one rank:
#   ("send", buf, peer, slot, offset, nbytes)   post a send (non-blocking)
#   ("recv", buf, peer, slot, offset, nbytes)   post a receive (non-blocking)
#   ("wait_send", buf) / ("wait_recv", buf)     block until one more completion on buf
#   ("reduce", dst_off, src_buf, src_off, nbytes)  out[dst] = op(out[dst], src[...])
# Buffers: "out" (the tensor), "tmp" (all_reduce scratch, uninitialised), "zero".


def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def _ring_allreduce(r: int, w: int, elements: int, e: int) -> tuple[list, int]:
    """gloo/allreduce.cc ``ring()`` as a message program; returns (program, tmp bytes)."""
    total = elements * e
    if elements == 0 or w == 1:
        return [], 0
    slot = "all_reduce"
    recv_rank = (r + 1) % w
    send_rank = (r - 1) % w
    max_seg = e * max(1, _MAX_SEGMENT_BYTES // e)
    nseg = _round_up(max(-(-total // max_seg), w * 2), w)
    per_rank = nseg // w
    seg = _round_up(-(-total // nseg), e)
    seg_off = (0, seg)
    prog: list = []

    def rs(i):
        so = (((r + 1) * per_rank + i) * seg) % (nseg * seg)
        ro = (((r + 2) * per_rank + i) * seg) % (nseg * seg)
        return so, ro, min(seg, total - so), min(seg, total - ro)

    n_iter = nseg - per_rank + 2
    for i in range(n_iter):
        if i >= 2:
            _, pro, psl, prl = rs(i - 2)
            if prl > 0:
                prog.append(("wait_recv", "tmp"))
                prog.append(("reduce", pro, "tmp", seg_off[i & 1], prl))
            if psl > 0:
                prog.append(("wait_send", "out"))
        if i < nseg - per_rank:
            so, ro, sl, rl = rs(i)
            if rl > 0:
                prog.append(("recv", "tmp", recv_rank, slot, seg_off[i & 1], rl))
            if sl > 0:
                prog.append(("send", "out", send_rank, slot, so, sl))

    def ag(i):
        so = ((r * per_rank + i) * seg) % (nseg * seg)
        ro = (((r + 1) * per_rank + i) * seg) % (nseg * seg)
        return so, ro, min(seg, total - so), min(seg, total - ro)

    for i in range(n_iter):
        if i >= 2:
            _, _, psl, prl = ag(i - 2)
            if prl > 0:
                prog.append(("wait_recv", "out"))
            if psl > 0:
                prog.append(("wait_send", "out"))
        if i < nseg - per_rank:
            so, ro, sl, rl = ag(i)
            if rl > 0:
                prog.append(("recv", "out", recv_rank, slot, ro, rl))
            if sl > 0:
                prog.append(("send", "out", send_rank, slot, so, sl))
    return prog, 2 * seg


def _broadcast(r: int, w: int, nbytes: int, root: int) -> list:
    """gloo/broadcast.cc: binomial tree rooted at ``root`` (virtual rank 0)."""
    slot = "broadcast"
    if w == 1:
        return []
    vrank = (r + w - root) % w
    dim = max(1, math.ceil(math.log2(w)))
    mask = (1 << dim) - 1
    prog: list = []
    nsends = 0
    for i in range(dim):
        mask ^= 1 << i
        if vrank & mask:
            continue
        vpeer = vrank ^ (1 << i)
        if vpeer >= w:
            continue
        peer = (vpeer + root) % w
        if (vrank & (1 << i)) == 0:
            prog.append(("send", "out", peer, slot, 0, nbytes))
            nsends += 1
        else:
            prog.append(("recv", "out", peer, slot, 0, nbytes))
            prog.append(("wait_recv", "out"))
    prog += [("wait_send", "out")] * nsends
    return prog


def _allgather(r: int, w: int, in_bytes: int) -> list:
    """gloo/allgather.cc: ring (to r+1, from r-1), each rank's block sent in two halves."""
    slot = "all_gather"
    if w == 1:
        return []
    out_bytes = in_bytes * w
    recv_rank = (r - 1) % w
    send_rank = (r + 1) % w
    cs = (in_bytes // 2, in_bytes - in_bytes // 2)
    co = (0, cs[0])
    prog: list = []
    for i in range((w - 1) * 2):
        s_seg = w + r - i // 2
        r_seg = s_seg - 1
        so = (s_seg * in_bytes + co[i & 1]) % out_bytes
        ro = (r_seg * in_bytes + co[i & 1]) % out_bytes
        size = cs[i & 1]
        if i >= 2:
            prog += [("wait_send", "out"), ("wait_recv", "out")]
        prog.append(("send", "out", send_rank, slot, so, size))
        prog.append(("recv", "out", recv_rank, slot, ro, size))
    prog += [("wait_send", "out"), ("wait_recv", "out")] * 2
    return prog


def _barrier(r: int, w: int) -> list:
    """gloo/barrier.cc: dissemination barrier with zero-byte messages."""
    slot = "barrier"
    prog: list = []
    d = 1
    while d < w:
        prog.append(("recv", "zero", (r - d) % w, slot, 0, 0))
        prog.append(("send", "zero", (r + d) % w, slot, 0, 0))
        prog.append(("wait_recv", "zero"))
        prog.append(("wait_send", "zero"))
        d <<= 1
    return prog


def _program(c: CollectiveCall, w: int) -> tuple[list, int, int]:
    """(program, out buffer bytes, tmp bytes) for one call."""
    elements, e = _elements(c) if c.op != "barrier" else (0, 1)
    nbytes = elements * e
    if c.op == "all_reduce":
        prog, tmp = _ring_allreduce(c.rank, w, elements, e)
        return prog, nbytes, tmp
    if c.op == "broadcast":
        root = 0 if c.root is None else c.root
        return _broadcast(c.rank, w, nbytes, root), nbytes, 0
    if c.op == "all_gather":
        return _allgather(c.rank, w, nbytes), nbytes * w, 0
    if c.op == "barrier":
        return _barrier(c.rank, w), 0, 0
    if c.op == "send":
        return [("send", "out", c.root, "p2p", 0, nbytes), ("wait_send", "out")], nbytes, 0
    if c.op == "recv":
        return [("recv", "out", c.root, "p2p", 0, nbytes), ("wait_recv", "out")], nbytes, 0
    raise NotImplementedError(c.op)


# ---------------------------------------------------------------------------------------
# Execution: FIFO matching per (src, dst, slot), blocking waits
# ---------------------------------------------------------------------------------------

_UNDEF = None  # an undefined byte (uninitialised gloo scratch memory)


@dataclass
class _Rank:
    call: CollectiveCall
    prog: list
    bufs: dict
    pc: int = 0
    done: bool = False
    aborted: bool = False
    peer_error: bool = False
    completions: dict = field(default_factory=dict)  # (buf, "send"/"recv") -> count
    pending: dict = field(default_factory=dict)  # (buf, peer) -> number of unmatched ops
    abort_detail: str = ""
    error_detail: str = ""
    blocked_on: str = ""


def _reduce_bytes(call: CollectiveCall, dst: list, dst_off: int, src: list, src_off: int, n: int):
    """Element-wise ``dst = op(dst, src)`` in this rank's dtype and reduce op."""
    elements, e = _elements(call)
    dtype = call.dtype.removeprefix("torch.")
    if dtype in ("complex64", "complex128"):
        dtype = "float32" if dtype == "complex64" else "float64"
    op = (call.reduce_op or "SUM").upper()
    for k in range(0, n - n % e, e):
        a = dst[dst_off + k: dst_off + k + e]
        b = src[src_off + k: src_off + k + e]
        if any(x is _UNDEF for x in a) or any(x is _UNDEF for x in b):
            dst[dst_off + k: dst_off + k + e] = [_UNDEF] * e
            continue
        va, vb = _decode(bytes(a), dtype), _decode(bytes(b), dtype)
        dst[dst_off + k: dst_off + k + e] = list(_encode(_apply(op, va, vb, dtype), dtype))


def _apply(op: str, a, b, dtype: str):
    if op in ("SUM", "AVG"):
        return a + b
    if op == "PRODUCT":
        return a * b
    if op == "MIN":
        return min(a, b) if not _isnan(a) else a
    if op == "MAX":
        return max(a, b) if not _isnan(a) else a
    if op == "BAND":
        return int(a) & int(b)
    if op == "BOR":
        return int(a) | int(b)
    if op == "BXOR":
        return int(a) ^ int(b)
    raise ValueError(f"unknown reduce op {op}")


def _isnan(x) -> bool:
    return isinstance(x, float) and x != x


_FMT = {"float32": "<f", "float64": "<d", "float16": "<e", "int64": "<q", "int32": "<i",
        "int16": "<h", "int8": "<b", "uint8": "<B", "bool": "<?",
        "float": "<f", "double": "<d", "half": "<e", "long": "<q", "int": "<i", "short": "<h"}


def _decode(b: bytes, dtype: str):
    if dtype == "bfloat16":
        return struct.unpack("<f", b"\x00\x00" + b)[0]
    if dtype == "bool":
        return b[0] != 0
    return struct.unpack(_FMT[dtype], b)[0]


def _encode(v, dtype: str) -> bytes:
    if dtype == "bfloat16":
        return struct.pack("<f", float(v))[2:]  # truncation (round-to-nearest in torch)
    if dtype == "bool":
        return bytes([1 if v else 0])
    fmt = _FMT[dtype]
    if fmt[1] in "qihbB":
        bits = struct.calcsize(fmt) * 8
        v = int(v) & ((1 << bits) - 1)
        if fmt[1] != "B" and v >= 1 << (bits - 1):
            v -= 1 << bits
        return struct.pack(fmt, v)
    try:
        return struct.pack(fmt, float(v))
    except OverflowError:
        return struct.pack(fmt, math.copysign(math.inf, v))


def _execute(
    calls: list[CollectiveCall],
    w: int,
    inputs: dict[int, list] | None,
    exited: frozenset[int] = frozenset(),
):
    ranks: dict[int, _Rank] = {}
    for c in calls:
        prog, out_bytes, tmp_bytes = _program(c, w)
        if inputs is None:  # outcome only: no byte-level data (keeps huge buckets cheap)
            ranks[c.rank] = _Rank(call=c, prog=prog, bufs={})
            continue
        bufs = {"zero": [], "tmp": [_UNDEF] * tmp_bytes}
        out = [0] * out_bytes
        if c.rank in inputs:
            raw = b"".join(_encode(v, _norm_dtype(c.dtype)) for v in inputs[c.rank])
            if c.op == "all_gather":
                out = [_UNDEF] * out_bytes
                n = len(raw)
                out[c.rank * n: (c.rank + 1) * n] = list(raw)
            else:
                out = list(raw)[:out_bytes] + [0] * max(0, out_bytes - len(raw))
        bufs["out"] = out
        ranks[c.rank] = _Rank(call=c, prog=prog, bufs=bufs)

    dead: set[int] = set(exited)  # processes that are gone (exited before, or aborted)
    sends: dict = {}  # (src, dst, slot) -> list of (buf, off, n), FIFO
    recvs: dict = {}  # (src, dst, slot) -> list of (buf, off, n), FIFO

    # Rounds: (A) every live rank runs until it blocks in a wait, posting sends/recvs;
    # (B) all posted pairs are matched "simultaneously". A receiver that gets an
    # oversized message aborts, but only after the round: sends it had already posted
    # are still delivered (both ranks' I/O threads work concurrently, e.g. 1000 vs 1001
    # elements aborts *both* ranks), and the sender's send completes (the bytes were
    # written to the socket).
    while True:
        progress = False
        for r in sorted(ranks):
            st = ranks[r]
            while not (st.aborted or st.peer_error) and st.pc < len(st.prog):
                step = st.prog[st.pc]
                kind = step[0]
                if kind in ("send", "recv"):
                    _, buf, peer, slot, off, n = step
                    if peer in dead:
                        # Pair::send/recv -> throwIfException(): the pair already saw EOF.
                        st.peer_error = True
                        st.error_detail = f"posts a {kind} to rank {peer}, which is gone"
                        progress = True
                        break
                    if peer not in ranks:
                        raise ValueError(f"rank {r} talks to rank {peer}, which has no entry")
                    key = (r, peer, slot) if kind == "send" else (peer, r, slot)
                    q = sends if kind == "send" else recvs
                    q.setdefault(key, []).append((buf, off, n))
                    st.pending[(buf, peer)] = st.pending.get((buf, peer), 0) + 1
                elif kind in ("wait_send", "wait_recv"):
                    ck = (step[1], kind[5:])
                    if st.completions.get(ck, 0) <= 0:
                        break
                    st.completions[ck] -= 1
                elif kind == "reduce" and st.bufs:
                    _, dst_off, src_buf, src_off, n = step
                    _reduce_bytes(st.call, st.bufs["out"], dst_off, st.bufs[src_buf], src_off, n)
                st.pc += 1
                progress = True
            if not (st.aborted or st.peer_error) and st.pc >= len(st.prog):
                st.done = True
        newly_aborted: set = set()
        for key in sorted(set(sends) & set(recvs)):
            src, dst, _ = key
            rs, rd = ranks[src], ranks[dst]
            sq, rq = sends[key], recvs[key]
            while sq and rq:
                sbuf, soff, sn = sq.pop(0)
                rbuf, roff, rn = rq.pop(0)
                progress = True
                rs.pending[(sbuf, dst)] -= 1
                rd.pending[(rbuf, src)] -= 1
                # The sender writes as soon as it has the receiver's RECV_READY: its send
                # completes even if the receiver's I/O thread dies on this message.
                rs.completions[(sbuf, "send")] = rs.completions.get((sbuf, "send"), 0) + 1
                if dst in newly_aborted:
                    continue
                if sn > rn:
                    newly_aborted.add(dst)
                    if not rd.abort_detail:
                        rd.abort_detail = (
                            f"rank {dst} receives {sn} bytes from rank {src} into a {rn}-byte "
                            f"receive ({_describe(rd.call)} vs {_describe(rs.call)}): "
                            f"op.preamble.length <= op.nbytes. {sn} vs {rn}"
                        )
                    continue
                if rd.bufs:
                    rd.bufs[rbuf][roff: roff + sn] = rs.bufs[sbuf][soff: soff + sn]
                rd.completions[(rbuf, "recv")] = rd.completions.get((rbuf, "recv"), 0) + 1
        for r in newly_aborted:
            ranks[r].aborted = True
            ranks[r].done = False
            dead.add(r)
            # The process is gone: what it had posted but not matched never will be.
            for key in list(sends):
                if key[0] == r:
                    sends[key] = []
            for key in list(recvs):
                if key[1] == r:
                    recvs[key] = []
        if not progress:
            break

    # A rank blocked in waitSend/waitRecv on a buffer that still has an operation
    # pending with a dead peer gets that pair's exception (Connection closed/reset by
    # peer); a rank blocked on a buffer whose pending peers are alive (but stuck) times out.
    for st in ranks.values():
        if st.done or st.aborted or st.peer_error:
            continue
        step = st.prog[st.pc]
        buf = step[1]
        gone = sorted(p for (b, p), n in st.pending.items() if b == buf and n > 0 and p in dead)
        if gone:
            st.peer_error = True
            st.error_detail = f"waits on an operation pending with rank {gone[0]}, which is gone"
        else:
            peers = sorted(p for (b, p), n in st.pending.items() if b == buf and n > 0)
            what = "send" if step[0] == "wait_send" else "recv"
            st.blocked_on = f"{what} (pending with rank(s) {peers})" if peers else what
    return ranks


def _norm_dtype(d: str) -> str:
    d = d.removeprefix("torch.")
    return {"complex64": "float32", "complex128": "float64"}.get(d, d)


def _signature(c: CollectiveCall, w: int) -> tuple:
    """Fields that matter for a matched call (reduce_op matters for values only)."""
    root = c.root if c.op in ROOTED_OPS or c.op in P2P_OPS else None
    numel = 0 if c.op == "barrier" else c.numel
    dtype = None if c.op == "barrier" else _norm_dtype(c.dtype)
    red = (c.reduce_op or "SUM").upper() if c.op in REDUCING_OPS else None
    return (c.op, numel, dtype, red, root)


def _rank_maps(entries, w: int, exited) -> tuple[dict | None, dict | None]:
    """If the calls use global ranks, map them to group ranks (ascending order, like
    ``new_group``); returns (None, None) when they already are group ranks 0..W-1."""
    got = [e.rank for e in entries]
    members = sorted(set(got) | set(exited))
    if len(set(got)) != len(got) or set(got) & set(exited) or len(members) != w:
        raise ValueError(f"need exactly one entry per live member of a group of {w} "
                         f"(exited: {sorted(exited)}), got ranks {sorted(got)}")
    if members == list(range(w)):
        return None, None
    to_group = {r: g for g, r in enumerate(members)}
    return to_group, {g: r for r, g in to_group.items()}


def _remap(e: CollectiveCall, to_group: dict) -> CollectiveCall:
    root = e.root
    if root is not None:
        if root not in to_group:
            raise ValueError(f"rank {e.rank}: root/peer {root} is not a member of the group")
        root = to_group[root]
    return CollectiveCall(to_group[e.rank], e.op, e.numel, e.dtype, e.reduce_op, root)


def classify_mismatch(
    entries: list[CollectiveCall],
    world_size_of_group: int,
    *,
    exited: frozenset[int] | set[int] = frozenset(),
) -> MismatchVerdict:
    """Classify one per-group sequence position, given every member's call.

    ``entries`` holds one call per live group member. Ranks (and roots/peers) may be
    group ranks 0..W-1 or global ranks; global ranks are mapped to group ranks in
    ascending order (as ``new_group`` does) and the verdict uses the caller's numbering.
    ``exited``
    lists group ranks whose process is gone (exited, with or without
    ``destroy_process_group``, or crashed) and which therefore issue nothing: a rank
    that posts a message to one of them fails at once with ``Connection closed by
    peer``; a rank that only waits on live-but-stuck peers times out.
    Returns a :class:`MismatchVerdict` (see the module docstring for the rule).
    """
    w = world_size_of_group
    to_group, to_caller = _rank_maps(entries, w, exited)
    if to_group is not None:
        v = classify_mismatch([_remap(e, to_group) for e in entries], w,
                              exited={to_group[r] for r in exited})
        v.aborting_ranks = [to_caller[r] for r in v.aborting_ranks]
        v.rank_outcomes = {to_caller[r]: o for r, o in v.rank_outcomes.items()}
        v.blocked_on = {to_caller[r]: o for r, o in v.blocked_on.items()}
        v.detail += f" (group ranks {list(range(w))} = ranks {[to_caller[g] for g in range(w)]})"
        return v
    exited = frozenset(exited)
    entries = sorted(entries, key=lambda e: e.rank)
    sigs = {_signature(e, w) for e in entries}
    if not exited and len(sigs) == 1 and entries[0].op not in ("send", "recv"):
        return MismatchVerdict("ok", [], "identical calls", {e.rank: "ok" for e in entries})

    ops = {e.op for e in entries}
    unmodelled = ops - MODELLED_OPS
    if unmodelled:
        if len(ops) > 1:
            detail = (f"different collectives {sorted(ops)} use different gloo slot prefixes: "
                      "no message can match, every rank blocks until the PG timeout")
        else:
            detail = (f"{sorted(ops)[0]} with differing arguments (or exited ranks) is not "
                      "modelled; conservatively a hang (PG timeout)")
        return MismatchVerdict("hang", [], detail, {e.rank: "hang" for e in entries},
                               modelled=False)

    ranks = _execute(entries, w, None, exited)
    outcomes: dict[int, RankOutcome] = {}
    for r, s in ranks.items():
        if s.aborted:
            outcomes[r] = "abort"
        elif s.done:
            outcomes[r] = "ok"
        elif s.peer_error:
            outcomes[r] = "peer_error"
        else:
            outcomes[r] = "hang"
    blocked = {r: s.blocked_on for r, s in ranks.items() if outcomes[r] == "hang"}
    aborting = sorted(r for r, o in outcomes.items() if o == "abort")
    if aborting:
        return MismatchVerdict("abort", aborting, ranks[aborting[0]].abort_detail, outcomes,
                               blocked_on=blocked)
    hanging = sorted(blocked)
    if hanging:
        return MismatchVerdict("hang", [], _hang_detail(entries, ranks, hanging, exited),
                               outcomes, blocked_on=blocked)
    if exited:
        errs = sorted(r for r, o in outcomes.items() if o == "peer_error")
        if errs:
            # No dedicated verdict kind: a peer-closed error is reported as "hang" with
            # every affected rank marked peer_error (it raises at once, not after the timeout).
            return MismatchVerdict("hang", [], f"ranks {errs} fail at once: "
                                   f"{ranks[errs[0]].error_detail}", outcomes)
        return MismatchVerdict("ok", [], "no live rank needs the exited ranks", outcomes)
    return MismatchVerdict("silent", [], _silent_detail(entries), outcomes)


def _describe(c: CollectiveCall) -> str:
    if c.op == "barrier":
        return f"r{c.rank}:barrier"
    s = f"r{c.rank}:{c.op}[{c.numel}x{c.dtype}]"
    if c.op == "all_reduce":
        s += f"({(c.reduce_op or 'SUM').upper()})"
    if c.root is not None and c.op not in ("all_reduce", "all_gather"):
        s += f"(root={c.root})"
    return s


def _hang_detail(entries, ranks, hanging, exited=frozenset()) -> str:
    ops = {e.op for e in entries}
    calls = ", ".join(_describe(e) for e in entries)
    if len(ops) > 1:
        why = "different collectives use different gloo slots, so nothing matches"
    else:
        why = "message schedules differ (count/order of per-peer messages)"
    if exited:
        why += f"; ranks {sorted(exited)} have exited"
    r = hanging[0]
    return (f"{calls}: {why}; ranks {hanging} block until the PG timeout "
            f"(rank {r}: 'Timed out waiting <T>ms for {ranks[r].blocked_on.split()[0]} operation')")


def _silent_detail(entries) -> str:
    calls = ", ".join(_describe(e) for e in entries)
    return (f"{calls}: identical per-peer message schedules, data is exchanged as raw bytes; "
            "each rank reduces received bytes as its own dtype with its own reduce op")


def mixed_result(
    entries: list[CollectiveCall],
    world_size_of_group: int,
    inputs: dict[int, list],
) -> dict[int, list | None]:
    """Values each rank ends up with after a (possibly mismatched) collective.

    ``inputs[rank]`` is that rank's flat input as Python numbers (for all_gather, the
    rank's own contribution). Returns, per rank, the flat output (all_gather: the
    concatenated W blocks) or ``None`` if the rank aborts/blocks. Elements that
    depend on uninitialised gloo scratch memory (a short message landed in the ring
    all_reduce ``tmp`` buffer) are ``None``. AVG is SUM followed by a local division
    by the group size on the ranks that asked for AVG (ProcessGroupGloo), so a rank
    using SUM next to a rank using AVG gets the plain sum.

    Mechanism (gloo/allreduce.cc ring): with W ranks the buffer is split into
    ``nseg = roundup(max(ceil(bytes/1MiB), 2W), W)`` segments; each rank finishes
    (reduce-scatter) its own segments with *its* reduce function, reading the peer's
    bytes as *its* dtype, and the finished segments are then copied verbatim to
    everyone (all-gather). So different reduce ops give a per-segment patchwork.
    """
    w = world_size_of_group
    to_group, to_caller = _rank_maps(entries, w, ())
    if to_group is not None:
        res = mixed_result([_remap(e, to_group) for e in entries], w,
                           {to_group[r]: v for r, v in inputs.items()})
        return {to_caller[g]: v for g, v in res.items()}
    ranks = _execute(sorted(entries, key=lambda e: e.rank), w, inputs)
    res: dict[int, list | None] = {}
    for r, s in ranks.items():
        if not s.done:
            res[r] = None
            continue
        dtype = _norm_dtype(s.call.dtype)
        e = _esize(dtype)
        out = s.bufs["out"]
        vals: list = []
        for k in range(0, len(out) - len(out) % e, e):
            chunk = out[k: k + e]
            vals.append(None if any(x is _UNDEF for x in chunk) else _decode(bytes(chunk), dtype))
        if s.call.op == "all_reduce" and (s.call.reduce_op or "").upper() == "AVG":
            vals = [None if v is None else _avg(v, w, dtype) for v in vals]
        res[r] = vals
    return res


def _avg(v, w: int, dtype: str):
    if dtype.startswith("int") or dtype in ("long", "int", "short", "uint8"):
        return int(v / w)
    return _decode(_encode(v / w, dtype), dtype)
