"""What ProcessGroupGloo runs per op (torch 2.13 on CPU, gloo's ``gloo/*.cc``), once.

One model of Gloo's algorithms, used by:
  * the mismatch rules (`simdist.engine.gloo_rules`), which pair these per-rank message
    programs the way Gloo's tcp transport does, to tell what mismatched calls do;
  * calibration (`simdist.timing.fit`), whose piecewise fit snaps a regime change to the
    size where the ring all_reduce's segment structure changes (`segment_thresholds`).

Gloo's broadcast, barrier and all_gather are the binomial tree, dissemination and ring of
`simdist.collectives.generators`, so their programs are built from those schedules; what
is Gloo's own is *how* a rank posts and waits (sends posted ahead, two messages in flight,
all_gather blocks sent in halves). The ring all_reduce is Gloo's segmented, pipelined ring
(``allreduce.cc`` ``ring()``), which no textbook schedule describes.

A message program is one rank's list of steps, executed in order:
  ``("send", buf, peer, slot, offset, nbytes)``  post a send (non-blocking)
  ``("recv", buf, peer, slot, offset, nbytes)``  post a receive (non-blocking)
  ``("wait_send", buf)`` / ``("wait_recv", buf)``  block until one more completion on buf
  ``("reduce", dst_offset, src_buf, src_offset, nbytes)``  out[dst] = op(out[dst], src[...])
Buffers: ``"out"`` (the tensor), ``"tmp"`` (all_reduce/reduce scratch, uninitialised), ``"zero"``,
``"in"`` (all_to_all's input), ``"in<i>"`` (the scatter root's block i, one buffer each).
The slot is the op's name: gloo derives every collective's message slot from a per-op
prefix and the call's tag, so different ops never exchange a byte; p2p uses ``"p2p"``.
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.collectives.algorithms import make_schedule
from simdist.collectives.schedule import Transfer

# gloo::AllreduceOptionsImpl::kMaxSegmentSize (gloo/allreduce.h)
MAX_SEGMENT_BYTES = 1 << 20

#: Ops whose message program is known (the others are not modelled at message level).
# all_to_all with split sizes: Gloo's alltoallv (gloo/alltoallv.cc; alltoall's slot prefix, kAlltoallSlotPrefix)
ALLTOALLV = "all_to_allv"
PROGRAM_OPS = frozenset({"all_reduce", "reduce", "broadcast", "all_gather", "barrier", "all_to_all", "gather", "scatter",
                         "send", "recv", ALLTOALLV})


@dataclass(frozen=True)
class MessageProgram:
    """One rank's message program and the buffers it needs (bytes)."""

    steps: list[tuple]
    out_bytes: int
    tmp_bytes: int = 0


# --------------------------------------------------------------------------- ring all_reduce
def _round_up(x: int, m: int) -> int:
    return (x + m - 1) // m * m


def ring_segments(nbytes: int, p: int, elem: int = 4) -> tuple[int, int]:
    """(numSegments, segmentBytes) of gloo's ring all_reduce (gloo/allreduce.cc):
    numSegments = roundUp(max(ceil(n / maxSegment), 2p), p), segmentBytes =
    roundUp(ceil(n / numSegments), elem), maxSegment = 1 MiB rounded down to elements."""
    max_seg = elem * max(1, MAX_SEGMENT_BYTES // elem)
    num = _round_up(max(-(-nbytes // max_seg), 2 * p), p)
    seg = _round_up(max(-(-nbytes // num), 1), elem)
    return num, seg


def ring_messages(nbytes: int, p: int) -> int:
    """Messages each rank sends in gloo's ring all_reduce: reduce-scatter + all-gather."""
    num, _ = ring_segments(nbytes, p)
    return 2 * (num - num // p)


def segment_thresholds(p: int) -> list[int]:
    """Sizes where gloo's ring changes structure: above 2p MiB segments stop growing."""
    return [2 * p * MAX_SEGMENT_BYTES]


def reduce_segments(nbytes: int, p: int, elem: int = 4) -> tuple[int, int]:
    """(numSegments, segmentBytes) of gloo's ring reduce (gloo/reduce.cc): segmentBytes =
    roundUp(min(ceil(n / 2p), maxSegment), elem), numSegments = roundUp(max(ceil(n /
    segmentBytes), 2p), p). The same as the all_reduce's up to 2p MiB, coarser above."""
    max_seg = elem * max(1, MAX_SEGMENT_BYTES // elem)
    seg = _round_up(max(min(-(-nbytes // (2 * p)), max_seg), 1), elem)
    return _round_up(max(-(-nbytes // seg), 2 * p), p), seg


def ring_blocks(elements: int, p: int, elem: int, op: str = "all_reduce") -> list[tuple[int, int]]:
    """Element ranges [lo, hi) of the p blocks of the ring all_reduce below (or of the ring
    reduce, `op="reduce"`, which differs in its segment sizes only): block j (its
    ``numSegments / p`` segments) travels the ring from rank j - 1 down to rank j, each rank
    adding its own elements to what it received, so block j sums to
    ``x[j] + (x[j+1] + (... + (x[j-2] + x[j-1])))`` (indices mod p). This is the order of
    Gloo's float sums, checked bit for bit against torch 2.13 for 3 and 4 ranks (all_reduce,
    reduce, reduce_scatter); ranges past the end are empty."""
    nseg, seg = (reduce_segments if op == "reduce" else ring_segments)(elements * elem, p, elem)
    per = (nseg // p) * seg // elem
    return [(min(elements, j * per), min(elements, (j + 1) * per)) for j in range(p)]


def ring_chain(block: int, p: int) -> list[int]:
    """The ranks whose elements block `block` adds, innermost first: [j-1, j-2, ..., j]."""
    return [(block - k) % p for k in range(1, p + 1)]


def _ring_chunk(first: int, i: int, per_rank: int, nseg: int, seg: int, total: int) -> tuple[int, int]:
    """(offset, bytes) of segment i of rank `first`'s block; past the end: 0 bytes."""
    off = ((first * per_rank + i) * seg) % (nseg * seg)
    return off, max(0, min(seg, total - off))


def _ring_reduce_scatter(rank: int, p: int, total: int, nseg: int, seg: int, slot: str) -> tuple[list[tuple], list[int]]:
    """The reduce-scatter loop shared by gloo's ring all_reduce (allreduce.cc ``ring()``) and
    ring reduce (reduce.cc): iteration i sends segment i of rank + 1's block to rank - 1 and
    receives segment i of rank + 2's block from rank + 1 into the two-slot scratch buffer,
    waiting for (and reducing) the messages of iteration i - 2; afterwards rank r holds its
    own block r reduced. Returns the steps and the busy iterations (`_busy_iterations`)."""
    per_rank = nseg // p
    recv_from, send_to = (rank + 1) % p, (rank - 1) % p
    tmp_off = (0, seg)
    prog: list[tuple] = []

    def chunk(first: int, i: int) -> tuple[int, int]:
        return _ring_chunk(first, i, per_rank, nseg, seg, total)

    n_iter = nseg - per_rank + 2
    busy = _busy_iterations((rank, rank + 1, rank + 2), per_rank, nseg, -(-total // seg), n_iter)
    for i in busy:
        if i >= 2:
            ro, rl = chunk(rank + 2, i - 2)
            if rl > 0:
                prog += [("wait_recv", "tmp"), ("reduce", ro, "tmp", tmp_off[i & 1], rl)]
            if chunk(rank + 1, i - 2)[1] > 0:
                prog.append(("wait_send", "out"))
        if i < nseg - per_rank:
            (so, sl), (_, rl) = chunk(rank + 1, i), chunk(rank + 2, i)
            if rl > 0:
                prog.append(("recv", "tmp", recv_from, slot, tmp_off[i & 1], rl))
            if sl > 0:
                prog.append(("send", "out", send_to, slot, so, sl))
    return prog, busy


def ring_allreduce(rank: int, p: int, elements: int, elem: int) -> MessageProgram:
    """gloo/allreduce.cc ``ring()``: receive from rank + 1, send to rank - 1; each rank
    reduces its own segments (reduce-scatter), then passes finished segments on
    (all-gather); a step waits for the messages of two steps before (two in flight)."""
    total = elements * elem
    if elements == 0 or p == 1:
        return MessageProgram([], total)
    nseg, seg = ring_segments(total, p, elem)
    per_rank = nseg // p
    recv_from, send_to = (rank + 1) % p, (rank - 1) % p
    prog, busy = _ring_reduce_scatter(rank, p, total, nseg, seg, "all_reduce")

    def chunk(first: int, i: int) -> tuple[int, int]:
        return _ring_chunk(first, i, per_rank, nseg, seg, total)

    for i in busy:  # all-gather: send own finished segments, receive rank+1's
        if i >= 2:
            if chunk(rank + 1, i - 2)[1] > 0:
                prog.append(("wait_recv", "out"))
            if chunk(rank, i - 2)[1] > 0:
                prog.append(("wait_send", "out"))
        if i < nseg - per_rank:
            (so, sl), (ro, rl) = chunk(rank, i), chunk(rank + 1, i)
            if rl > 0:
                prog.append(("recv", "out", recv_from, "all_reduce", ro, rl))
            if sl > 0:
                prog.append(("send", "out", send_to, "all_reduce", so, sl))
    return MessageProgram(prog, total, 2 * seg)


def ring_reduce(rank: int, p: int, elements: int, elem: int, root: int) -> MessageProgram:
    """gloo/reduce.cc (ProcessGroupGloo's reduce on CPU): the ring reduce-scatter of the
    all_reduce (with `reduce_segments`, slot prefix ``kReduceSlotPrefix``), after which rank r
    holds block r reduced; then every other rank sends its block to the root, which posts
    one receive per rank in rank order (skipping empty blocks) and waits for them all.
    The non-roots' tensors keep the partial sums the ring left in them."""
    total = elements * elem
    if elements == 0 or p == 1:
        return MessageProgram([], total)
    nseg, seg = reduce_segments(total, p, elem)
    block = (nseg // p) * seg
    prog, _ = _ring_reduce_scatter(rank, p, total, nseg, seg, "reduce")

    def own(r: int) -> tuple[int, int]:
        off = r * block
        return off, max(0, min(block, total - off))

    if rank == root:
        recvs = [("recv", "out", r, "reduce", *own(r)) for r in range(p) if r != root and own(r)[1] > 0]
        return MessageProgram(prog + recvs + [("wait_recv", "out")] * len(recvs), total, 2 * seg)
    off, n = own(rank)
    if n > 0:
        prog += [("send", "out", root, "reduce", off, n), ("wait_send", "out")]
    return MessageProgram(prog, total, 2 * seg)


def _busy_iterations(firsts: tuple[int, ...], per_rank: int, nseg: int, nonempty: int, n_iter: int) -> list[int]:
    """The loop iterations of `ring_allreduce` that touch a non-empty segment: iteration i
    reads segments (first * per_rank + i) and (... + i - 2) mod nseg, and only the first
    `nonempty` segments hold bytes. A small tensor on many ranks has 2p segments, nearly
    all empty: the others post nothing, and skipping them makes a rank's program cost
    what it sends, not the group's size (a 1,024-rank hang is judged on these programs)."""
    if nonempty >= nseg:
        return list(range(n_iter))
    busy = set()
    for f in firsts:
        for j in range(nonempty):
            i = (j - f * per_rank) % nseg
            for at in (i, i + 2, i + nseg, i + nseg + 2):
                if at < n_iter:
                    busy.add(at)
    return sorted(busy)


# --------------------------------------------------------------------------- tree, ring, dissemination
def _sent(step: list[Transfer], rank: int) -> Transfer:
    return next(t for t in step if t.src == rank)


def _received(step: list[Transfer], rank: int) -> Transfer:
    return next(t for t in step if t.dst == rank)


def broadcast(rank: int, p: int, nbytes: int, root: int) -> MessageProgram:
    """gloo/broadcast.cc: the high-bit binomial tree from the root; a rank posts its sends
    without waiting and waits for them at the end, and waits for its receive at once."""
    prog: list[tuple] = []
    sends = 0
    for step in make_schedule("broadcast", "tree", p, nbytes, root).steps:
        for t in step:
            if t.src == rank:
                prog.append(("send", "out", t.dst, "broadcast", 0, nbytes))
                sends += 1
            elif t.dst == rank:
                prog += [("recv", "out", t.src, "broadcast", 0, nbytes), ("wait_recv", "out")]
    return MessageProgram(prog + [("wait_send", "out")] * sends, nbytes)


def allgather(rank: int, p: int, in_bytes: int) -> MessageProgram:
    """gloo/allgather.cc: the ring all_gather (to rank + 1, from rank - 1), each block
    sent in two halves, with the two messages before the current one in flight. An
    empty input sends nothing: on torch 2.13 such a call returns at once, even when a
    peer's input is not empty (that peer then blocks)."""
    if p == 1 or in_bytes == 0:
        return MessageProgram([], in_bytes * p)
    halves = (in_bytes // 2, in_bytes - in_bytes // 2)
    starts = (0, halves[0])
    steps = make_schedule("all_gather", "ring", p, in_bytes).steps
    prog: list[tuple] = []
    for i in range(2 * len(steps)):
        h = i & 1
        out, inc = _sent(steps[i // 2], rank), _received(steps[i // 2], rank)
        if i >= 2:
            prog += [("wait_send", "out"), ("wait_recv", "out")]
        prog.append(("send", "out", out.dst, "all_gather", out.pieces[0][0] + starts[h], halves[h]))
        prog.append(("recv", "out", inc.src, "all_gather", inc.pieces[0][1] + starts[h], halves[h]))
    prog += [("wait_send", "out"), ("wait_recv", "out")] * 2
    return MessageProgram(prog, in_bytes * p)


def barrier(rank: int, p: int) -> MessageProgram:
    """gloo/barrier.cc: the dissemination barrier, zero-byte messages, one round at a time."""
    prog: list[tuple] = []
    for step in make_schedule("barrier", "dissemination", p, 0).steps:
        src, dst = _received(step, rank).src, _sent(step, rank).dst
        prog += [("recv", "zero", src, "barrier", 0, 0), ("send", "zero", dst, "barrier", 0, 0)]
        prog += [("wait_recv", "zero"), ("wait_send", "zero")]
    return MessageProgram(prog, 0)


def alltoall(rank: int, p: int, nbytes: int) -> MessageProgram:
    """gloo/alltoall.cc: the own block is copied locally (not a message); the p - 1 sends
    (to rank + i) and receives (from rank - i) are all posted at once, then waited for."""
    blk = nbytes // p if p else 0
    prog: list[tuple] = []
    for i in range(1, p):
        to, frm = (rank + i) % p, (rank - i) % p
        prog += [("send", "in", to, "all_to_all", to * blk, blk), ("recv", "out", frm, "all_to_all", frm * blk, blk)]
    for _ in range(1, p):
        prog += [("wait_send", "in"), ("wait_recv", "out")]
    return MessageProgram(prog, blk * p)


def alltoallv(rank: int, p: int, send: tuple[int, ...], recv: tuple[int, ...]) -> MessageProgram:
    """gloo/alltoallv.cc: alltoall's order (the own block copied locally; the p - 1 sends to
    rank + i and receives from rank - i posted at once, then waited for), with each pair's
    own byte count: `send[k]` bytes to rank k from offset sum(send[:k]) of the input,
    `recv[k]` from rank k at offset sum(recv[:k]) of the output."""
    def offsets(sizes: tuple[int, ...]) -> list[int]:
        return [sum(sizes[:k]) for k in range(p)]

    s_off, r_off = offsets(send), offsets(recv)
    prog: list[tuple] = []
    for i in range(1, p):
        to, frm = (rank + i) % p, (rank - i) % p
        prog += [("send", "in", to, ALLTOALLV, s_off[to], send[to]),
                 ("recv", "out", frm, ALLTOALLV, r_off[frm], recv[frm])]
    for _ in range(1, p):
        prog += [("wait_send", "in"), ("wait_recv", "out")]
    return MessageProgram(prog, sum(recv))


def scatter(rank: int, p: int, nbytes: int, root: int) -> MessageProgram:
    """gloo/scatter.cc: the root posts a send of block i to each rank i (ascending), copies
    its own block, then waits for the sends in turn; any other rank receives its block from
    the root and waits. `nbytes`: the whole input, p blocks. Each block is its own Gloo buffer
    (ProcessGroupGloo gives `in[i]` one UnboundBuffer per input tensor), ``"in<i>"`` here: the
    root's wait on block i fails only when rank i goes, so a root stuck on a live rank's block
    times out whatever happened to a later one (`scatter_block_buffer`)."""
    blk = nbytes // p if p else 0
    if rank != root:
        return MessageProgram([("recv", "out", root, "scatter", 0, blk), ("wait_recv", "out")], blk)
    others = [i for i in range(p) if i != root]
    return MessageProgram([("send", scatter_block_buffer(i), i, "scatter", i * blk, blk) for i in others]
                          + [("wait_send", scatter_block_buffer(i)) for i in others], blk)


def scatter_block_buffer(i: int) -> str:
    """The name of the scatter root's buffer holding block i (sent to rank i)."""
    return f"in{i}"


def gather(rank: int, p: int, nbytes: int, root: int) -> MessageProgram:
    """gloo/gather.cc: the root posts a receive of block i from each rank i (ascending) into
    its output, copies its own block, then waits for the receives in turn; any other rank
    sends its input to the root and waits. `nbytes`: one rank's input (one block)."""
    if rank != root:
        return MessageProgram([("send", "out", root, "gather", 0, nbytes), ("wait_send", "out")], nbytes)
    others = [i for i in range(p) if i != root]
    return MessageProgram([("recv", "out", i, "gather", i * nbytes, nbytes) for i in others]
                          + [("wait_recv", "out")] * len(others), nbytes * p)


def message_count(op: str, p: int, elements: int, elem: int) -> int:
    """Sends and receives one rank posts in `message_program(op, ...)`, known without building
    it (the programs of huge tensors are long: the ring all_reduce has a message per MiB)."""
    if p <= 1:
        return 0
    if op == "all_reduce":
        return 0 if elements == 0 else 2 * ring_messages(elements * elem, p)
    if op == "reduce":  # the ring's reduce-scatter, then at most p - 1 receives at the root
        num = reduce_segments(elements * elem, p, elem)[0]
        return 0 if elements == 0 else 2 * (num - num // p) + p - 1
    if op == "all_gather":
        return 4 * (p - 1) if elements else 0
    if op in ("broadcast", "barrier"):
        return 2 * p.bit_length()
    if op in ("all_to_all", ALLTOALLV, "gather", "scatter"):  # gather, scatter: the root's p - 1, a leaf's 1
        return 2 * (p - 1)
    return 1  # send, recv


def message_program(op: str, rank: int, p: int, elements: int, elem: int, root: int | None,
                    splits: tuple[tuple[int, ...], tuple[int, ...]] | None = None) -> MessageProgram:
    """The program of one rank's call (`root`: the broadcast/reduce root, or the send/recv peer;
    `splits`: alltoallv's elements to and from each rank)."""
    nbytes = elements * elem
    if op == ALLTOALLV:
        if splits is None:
            raise ValueError("all_to_allv needs its split sizes")
        return alltoallv(rank, p, tuple(n * elem for n in splits[0]), tuple(n * elem for n in splits[1]))
    if op == "all_reduce":
        return ring_allreduce(rank, p, elements, elem)
    if op == "reduce":
        return ring_reduce(rank, p, elements, elem, 0 if root is None else root)
    if op == "broadcast":
        return broadcast(rank, p, nbytes, 0 if root is None else root)
    if op == "all_gather":
        return allgather(rank, p, nbytes)
    if op == "barrier":
        return barrier(rank, p)
    if op == "all_to_all":
        return alltoall(rank, p, nbytes)
    if op in ("gather", "scatter"):
        return (gather if op == "gather" else scatter)(rank, p, nbytes, 0 if root is None else root)
    if op in ("send", "recv"):
        wait = "wait_send" if op == "send" else "wait_recv"
        return MessageProgram([(op, "out", root, "p2p", 0, nbytes), (wait, "out")], nbytes)
    raise NotImplementedError(op)
