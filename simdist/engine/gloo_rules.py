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
   all_gather with half-chunks, dissemination barrier, ring reduce) as message programs
   (`simdist.collectives.gloo`), matches them as in (2) (`gloo_transport`, on raw
   bytes from `gloo_bytes` when values are asked for), and reports the result.
   Same schedule + same bytes = "silent"
   (values mixed: each rank reduces the bytes it receives as *its own* dtype with
   *its own* reduce op, see :func:`mixed_result`).

all_to_all (without split sizes) is gloo/alltoall.cc: every send and receive posted at once,
the own block copied locally, so blocks of the same byte size exchange whatever their
dtypes, a shorter one fills the front of the receiving block and a longer one aborts the
receiver, as for the others.

reduce is gloo/reduce.cc: the all_reduce's ring reduce-scatter (its own slot prefix and segment
sizes), then each non-root sends its block to the root. On Gloo, ProcessGroupGloo runs
reduce_scatter as all_reduces (`simdist.script.rank.pg`), so the engine brings it here as those.

gather and scatter are gloo/gather.cc and scatter.cc: the root posts one receive (send) per
other rank and waits for them in turn, the others send to (receive from) the root, so a rank
that exited fails exactly the ranks with a message pending with it on the buffer they wait on
(a scatter root's blocks are one buffer each; the values of mismatched ones are not modelled
byte by byte: `mixed_result` refuses them).

all_to_all with split sizes is gloo/alltoallv.cc (`ALLTOALLV`): alltoall's program with each
pair's own byte count, its messages only (the bytes of mismatched ones are not modelled).

Not modelled (reduce_scatter as one op): identical calls are
"ok", a different kind on the other side is "hang" (rule 1), same kind with different
arguments is reported conservatively as "hang" with a detail saying it is unmodelled.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import partial
from typing import Literal

from simdist.collectives.gloo import ALLTOALLV, PROGRAM_OPS, MessageProgram, message_count, message_program
from simdist.engine.gloo_bytes import UNDEF, average, decode_all, encode, real_dtype, reduce_into
from simdist.engine.gloo_transport import RankRun, receives_words, run_programs, size_enforce
from simdist.limits import MESSAGES
from simdist.vocab import P2P_OPS, REDUCING_OPS, ROOTED_OPS, dtype_bytes

__all__ = [
    "CollectiveCall",
    "MismatchVerdict",
    "classify_mismatch",
    "mixed_result",
    "MODELLED_OPS",
]


#: Ops whose gloo message schedule is re-executed here.
MODELLED_OPS = PROGRAM_OPS


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
    #: alltoallv's (`ALLTOALLV`) elements to and from each group rank
    splits: tuple[tuple[int, ...], tuple[int, ...]] | None = None


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
    #: for each hanging rank, the peers whose exit fails its wait ("Connection closed by peer"):
    #: those it has an operation pending with on the buffer it blocks on (Gloo's pair
    #: signals its exception to those buffers only); the others' exits leave it waiting
    waits_on: dict[int, frozenset[int]] = field(default_factory=dict)
    #: each aborting rank's fatal message: (its sender, bytes sent, bytes of the receive)
    aborts: dict[int, tuple[int, int, int]] = field(default_factory=dict)


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


def _program(c: CollectiveCall, w: int) -> MessageProgram:
    """The gloo message program of one rank's call."""
    elements, e = _elements(c) if c.op != "barrier" else (0, 1)
    return message_program(c.op, c.rank, w, elements, e, c.root, c.splits)


def _check_size(calls: list[CollectiveCall], w: int, per_byte: bool) -> None:
    """Refuse (LimitError, `limits.MESSAGES`) to build programs whose length the limit does not
    allow, before building them; with `per_byte` (values asked for), a message counts its bytes."""
    total = 0
    for c in calls:
        elements, e = _elements(c) if c.op != "barrier" else (0, 1)
        total += message_count(c.op, w, elements, e) + (elements * e if per_byte else 0)
    shown = ", ".join(_describe(c) for c in calls[:3]) + (", ..." if len(calls) > 3 else "")
    unit = "Gloo messages and bytes" if per_byte else "Gloo messages"
    MESSAGES.check(total, "simulation", f"modelling the mismatched collective {shown} takes {total:,} {unit}")


def _execute(
    calls: list[CollectiveCall],
    w: int,
    inputs: dict[int, list] | None,
    exited: frozenset[int] = frozenset(),
    unaware: dict[int, frozenset[int]] | None = None,
) -> dict[int, RankRun]:
    """Run the calls' programs on gloo's transport; with `inputs`, on real bytes."""
    _check_size(calls, w, inputs is not None)
    ranks: dict[int, RankRun] = {}
    for c in calls:
        prog = _program(c, w)
        run = RankRun(c.rank, prog.steps, {}, _describe(c), unaware=(unaware or {}).get(c.rank, frozenset()))
        if inputs is not None:
            dtype, op = real_dtype(c.dtype), (c.reduce_op or "SUM").upper()
            run.bufs = {"zero": [], "tmp": [UNDEF] * prog.tmp_bytes, "out": _initial_out(c, prog, inputs, dtype)}
            if c.op == "all_to_all":  # sends read the input; only the own block is copied locally
                run.bufs["in"], blk = run.bufs["out"], prog.out_bytes // w
                run.bufs["out"] = [UNDEF] * prog.out_bytes
                run.bufs["out"][c.rank * blk: (c.rank + 1) * blk] = run.bufs["in"][c.rank * blk: (c.rank + 1) * blk]
            elif c.op == ALLTOALLV:
                run.bufs["in"], run.bufs["out"] = _alltoallv_buffers(c, prog, inputs, e_size(c))
            run.reduce = partial(reduce_into, dtype=dtype, op=op)
        ranks[c.rank] = run
    run_programs(ranks, exited)
    return ranks


def e_size(c: CollectiveCall) -> int:
    return _elements(c)[1]


def _alltoallv_buffers(c: CollectiveCall, prog: MessageProgram, inputs: dict[int, list], e: int) -> tuple[list, list]:
    """alltoallv's input bytes and its output before the messages: undefined but for the
    own block, copied locally (gloo/alltoallv.cc)."""
    send, recv = (tuple(n * e for n in x) for x in c.splits)  # type: ignore[union-attr]
    raw = list(b"".join(encode(v, real_dtype(c.dtype)) for v in inputs.get(c.rank, [])))
    src, dst, n = sum(send[:c.rank]), sum(recv[:c.rank]), min(send[c.rank], recv[c.rank])
    out = [UNDEF] * prog.out_bytes
    out[dst: dst + n] = raw[src: src + n]
    return raw, out


def _initial_out(c: CollectiveCall, prog: MessageProgram, inputs: dict[int, list], dtype: str) -> list:
    """The output buffer's bytes before the collective: the input (all_gather: at the
    rank's own block, the rest undefined), zero where the rank gave no input."""
    out_bytes = prog.out_bytes
    if c.rank not in inputs:
        return [0] * out_bytes
    raw = b"".join(encode(v, dtype) for v in inputs[c.rank])
    if c.op == "all_gather":
        out = [UNDEF] * out_bytes
        n = len(raw)
        out[c.rank * n: (c.rank + 1) * n] = list(raw)
        return out
    return list(raw)[:out_bytes] + [0] * max(0, out_bytes - len(raw))


def _signature(c: CollectiveCall, w: int) -> tuple:
    """Fields that matter for a matched call (reduce_op matters for values only)."""
    root = c.root if c.op in ROOTED_OPS or c.op in P2P_OPS else None
    numel = 0 if c.op == "barrier" else c.numel
    dtype = None if c.op == "barrier" else real_dtype(c.dtype)
    red = (c.reduce_op or "SUM").upper() if c.op in REDUCING_OPS else None
    return (c.op, numel, dtype, red, root, c.splits)


def _rank_maps(entries, w: int, exited, members: Sequence[int] | None = None) -> tuple[dict | None, dict | None]:
    """If the calls use global ranks, map them to group ranks: `members` in group-rank order
    (`new_group(ranks, sort_ranks=False)` keeps the given order, and Gloo's rings and trees
    follow group ranks), else ascending (new_group's default); returns (None, None) when they
    already are group ranks 0..W-1."""
    got = [e.rank for e in entries]
    order = sorted(set(got) | set(exited)) if members is None else list(members)
    if len(set(got)) != len(got) or set(got) & set(exited) or sorted(order) != sorted(set(got) | set(exited)) \
            or len(order) != w:
        raise ValueError(f"need exactly one entry per live member of a group of {w} "
                         f"(exited: {sorted(exited)}), got ranks {sorted(got)}")
    if order == list(range(w)):
        return None, None
    to_group = {r: g for g, r in enumerate(order)}
    return to_group, {g: r for r, g in to_group.items()}


def _remap(e: CollectiveCall, to_group: dict) -> CollectiveCall:
    root = e.root
    if root is not None:
        if root not in to_group:
            raise ValueError(f"rank {e.rank}: root/peer {root} is not a member of the group")
        root = to_group[root]
    return CollectiveCall(to_group[e.rank], e.op, e.numel, e.dtype, e.reduce_op, root, e.splits)


def classify_mismatch(
    entries: list[CollectiveCall],
    world_size_of_group: int,
    *,
    exited: frozenset[int] | set[int] = frozenset(),
    unaware: dict[int, frozenset[int]] | None = None,
    members: Sequence[int] | None = None,
) -> MismatchVerdict:
    """Classify one per-group sequence position, given every member's call.

    ``entries`` holds one call per live group member. Ranks (and roots/peers) may be
    group ranks 0..W-1 or global ranks; global ranks are mapped to group ranks in the order
    of ``members`` (the group's global ranks in group-rank order; None: ascending, as
    ``new_group`` sorts by default) and the verdict uses the caller's numbering.
    ``exited``
    lists group ranks whose process is gone (exited, with or without
    ``destroy_process_group``, or crashed) and which therefore issue nothing: a rank
    that posts a message to one of them fails at once with ``Connection closed by
    peer``; a rank that only waits on live-but-stuck peers times out. ``unaware[r]``: the
    exited ranks that rank r posted to before their sockets closed (it posted at the instant
    they ended): those posts are accepted, r goes on, and only its wait on them fails.
    Returns a :class:`MismatchVerdict` (see the module docstring for the rule).
    """
    w = world_size_of_group
    to_group, to_caller = _rank_maps(entries, w, exited, members)
    if to_group is not None:
        v = classify_mismatch([_remap(e, to_group) for e in entries], w,
                              exited={to_group[r] for r in exited},
                              unaware={to_group[r]: frozenset(to_group[d] for d in ds)
                                       for r, ds in (unaware or {}).items()})
        return _in_callers_ranks(v, to_caller, w)
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

    ranks = _execute(entries, w, None, exited, unaware)
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
    waits_on = {r: ranks[r].waits_on for r in blocked}
    aborting = sorted(r for r, o in outcomes.items() if o == "abort")
    if aborting:
        return MismatchVerdict("abort", aborting, ranks[aborting[0]].abort_detail, outcomes,
                               blocked_on=blocked, waits_on=waits_on,
                               aborts={r: ranks[r].abort_from for r in aborting if ranks[r].abort_from is not None})
    hanging = sorted(blocked)
    if hanging:
        return MismatchVerdict("hang", [], _hang_detail(entries, ranks, hanging, exited),
                               outcomes, blocked_on=blocked, waits_on=waits_on)
    if exited:
        errs = sorted(r for r, o in outcomes.items() if o == "peer_error")
        if errs:
            # No dedicated verdict kind: a peer-closed error is reported as "hang" with
            # every affected rank marked peer_error (it raises at once, not after the timeout).
            return MismatchVerdict("hang", [], f"ranks {errs} fail at once: "
                                   f"{ranks[errs[0]].error_detail}", outcomes)
        return MismatchVerdict("ok", [], "no live rank needs the exited ranks", outcomes)
    return MismatchVerdict("silent", [], _silent_detail(entries), outcomes)


def _in_callers_ranks(v: MismatchVerdict, to_caller: dict[int, int], w: int) -> MismatchVerdict:
    """A verdict on group ranks, renumbered to the caller's (global) ranks."""
    v.aborting_ranks = [to_caller[r] for r in v.aborting_ranks]
    v.rank_outcomes = {to_caller[r]: o for r, o in v.rank_outcomes.items()}
    v.blocked_on = {to_caller[r]: o for r, o in v.blocked_on.items()}
    v.waits_on = {to_caller[r]: frozenset(to_caller[p] for p in ps) for r, ps in v.waits_on.items()}
    v.aborts = {to_caller[r]: (to_caller[src], sent, room) for r, (src, sent, room) in v.aborts.items()}
    if v.aborts:  # the account in the caller's ranks (the calls' labels, in group ranks, left out)
        v.detail = "; ".join(receives_words(r, *v.aborts[r]) for r in v.aborting_ranks) + \
            f": {size_enforce(*v.aborts[v.aborting_ranks[0]][1:])}"
    v.detail += f" (group ranks {list(range(w))} = ranks {[to_caller[g] for g in range(w)]})"
    return v


def abort_words(v: MismatchVerdict, rank: int) -> tuple[str, str]:
    """What aborting `rank` of `v` prints (Gloo's `what()`, `size_enforce`) and the simulator's
    account of it in the verdict's ranks (`receives_words`)."""
    src, sent, room = v.aborts[rank]
    return size_enforce(sent, room), receives_words(rank, src, sent, room)


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
    members: Sequence[int] | None = None,
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
    if any(e.op in ("gather", "scatter") for e in entries):
        raise NotImplementedError("the values of mismatched gathers and scatters are not modelled byte by byte")
    to_group, to_caller = _rank_maps(entries, w, (), members)
    if to_group is not None:
        res = mixed_result([_remap(e, to_group) for e in entries], w,
                           {to_group[r]: v for r, v in inputs.items()})
        return {to_caller[g]: v for g, v in res.items()}
    ranks = _execute(sorted(entries, key=lambda e: e.rank), w, inputs)
    calls = {e.rank: e for e in entries}
    res: dict[int, list | None] = {}
    for r, s in ranks.items():
        if not s.done:
            res[r] = None
            continue
        c = calls[r]
        dtype = real_dtype(c.dtype)
        vals = decode_all(s.bufs["out"], dtype)
        if c.op == "all_reduce" and (c.reduce_op or "").upper() == "AVG":
            vals = [None if v is None else average(v, w, dtype) for v in vals]
        res[r] = vals
    return res
