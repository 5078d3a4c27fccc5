"""Gloo's tcp transport, as far as pairing messages goes: runs ranks' message programs.

Messages of one slot pair per (sender, receiver) in FIFO order, whatever their sizes
(gloo/transport/tcp/pair.cc). A message longer than the receive it lands in kills the
receiver (``GLOO_ENFORCE_LE(op.preamble.length, op.nbytes)`` on its I/O thread); a
shorter one completes silently; a rank that waits for a message nobody sends blocks
until the PG timeout, and one that posts to or waits on a dead peer fails at once -- unless it
posted before the peer's sockets closed (`RankRun.unaware`): then the post is accepted, the
rank goes on with its program, and only its wait on that peer fails.
The programs come from `simdist.collectives.gloo`; what they mean for a verdict is
`simdist.engine.gloo_rules`.

Execution goes in rounds: (A) every live rank runs until it blocks in a wait, posting
sends and receives; (B) all posted pairs are matched "simultaneously". A receiver that
gets an oversized message aborts, but only after the round: sends it had already posted
are still delivered (both ranks' I/O threads work concurrently, e.g. 1000 vs 1001
elements aborts *both* ranks), and the sender's send completes (the bytes were written
to the socket).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

# dst, dst_offset, src, src_offset, nbytes: this rank's element-wise reduction of raw bytes
Reducer = Callable[[list, int, list, int, int], None]


@dataclass
class RankRun:
    """One rank's program and where it got to. `bufs` is empty when only outcomes matter
    (no byte-level data: keeps huge buckets cheap)."""

    rank: int
    prog: list
    bufs: dict
    label: str  # the rank's call, for details
    reduce: Reducer | None = None
    # exited peers whose sockets had not closed yet when this rank posted (see `_advance`)
    unaware: frozenset = frozenset()
    pc: int = 0
    done: bool = False
    aborted: bool = False
    peer_error: bool = False
    completions: dict = field(default_factory=dict)  # (buf, "send"/"recv") -> count
    pending: dict = field(default_factory=dict)  # (buf, peer) -> number of unmatched ops
    abort_detail: str = ""
    abort_from: tuple[int, int, int] | None = None  # the message that killed it: (sender, bytes, receive's bytes)
    error_detail: str = ""
    blocked_on: str = ""
    # a blocked rank's peers with an operation pending on the buffer it waits on: when one
    # of them goes, the pair's exception reaches that buffer and the wait fails (`_diagnose`)
    waits_on: frozenset = frozenset()

    @property
    def stopped(self) -> bool:
        return self.aborted or self.peer_error


@dataclass
class _Wire:
    """Posted, unmatched operations: (src, dst, slot) -> FIFO of (buf, offset, nbytes)."""

    sends: dict = field(default_factory=dict)
    recvs: dict = field(default_factory=dict)
    dead: set = field(default_factory=set)  # processes that are gone (exited before, or aborted)
    fresh: set = field(default_factory=set)  # keys posted to since the last matching
    woken: set = field(default_factory=set)  # ranks that completed something in the last matching


def run_programs(ranks: dict[int, RankRun], exited: frozenset[int] = frozenset()) -> None:
    """Run every program to completion or to where it blocks for good (in place).

    After the first round only the ranks that completed an operation can move, and only
    the pairs with new posts can match: each round looks at those, not at every rank and
    pair (a hang on 1,024 ranks takes as many rounds as ranks). Each rank posts only its
    own side of its pairs, so the order ranks advance in within a round changes nothing."""
    wire = _Wire(dead=set(exited))
    movable = sorted(ranks)
    while True:
        progress = False
        for r in movable:
            progress |= _advance(ranks, ranks[r], wire)
        matched, newly_aborted = _match(ranks, wire)
        for r in newly_aborted:
            _abort(ranks[r], wire)
        if not (progress or matched):
            break
        movable = sorted(wire.woken)
        wire.woken = set()
    for st in ranks.values():
        if not (st.done or st.stopped):
            _diagnose(st, wire.dead)


def _advance(ranks: dict[int, RankRun], st: RankRun, wire: _Wire) -> bool:
    """Phase A for one rank: run until it blocks in a wait. Returns whether it moved."""
    progress = False
    while not st.stopped and st.pc < len(st.prog):
        step = st.prog[st.pc]
        kind = step[0]
        if kind in ("send", "recv"):
            _, buf, peer, slot, off, n = step
            if peer in wire.dead and peer not in st.unaware:
                # Pair::send/recv -> throwIfException(): the pair already saw EOF.
                st.peer_error = True
                st.error_detail = f"posts a {kind} to rank {peer}, which is gone"
                return True
            if peer in wire.dead:
                # posted while the peer was still unwinding: accepted, never paired; the
                # rank goes on posting and fails in the wait (`_diagnose`)
                st.pending[(buf, peer)] = st.pending.get((buf, peer), 0) + 1
                st.pc += 1
                progress = True
                continue
            if peer not in ranks:
                raise ValueError(f"rank {st.rank} talks to rank {peer}, which has no entry")
            key = (st.rank, peer, slot) if kind == "send" else (peer, st.rank, slot)
            q = wire.sends if kind == "send" else wire.recvs
            q.setdefault(key, []).append((buf, off, n))
            wire.fresh.add(key)
            st.pending[(buf, peer)] = st.pending.get((buf, peer), 0) + 1
        elif kind in ("wait_send", "wait_recv"):
            ck = (step[1], kind[5:])
            if st.completions.get(ck, 0) <= 0:
                break
            st.completions[ck] -= 1
        elif kind == "reduce" and st.bufs and st.reduce is not None:
            _, dst_off, src_buf, src_off, n = step
            st.reduce(st.bufs["out"], dst_off, st.bufs[src_buf], src_off, n)
        st.pc += 1
        progress = True
    if not st.stopped and st.pc >= len(st.prog):
        st.done = True
    return progress


def _match(ranks: dict[int, RankRun], wire: _Wire) -> tuple[bool, set[int]]:
    """Phase B: pair posted sends and receives. Returns (any matched, receivers that abort)."""
    matched = False
    newly_aborted: set[int] = set()
    fresh, wire.fresh = wire.fresh, set()
    for key in sorted(k for k in fresh if k in wire.sends and k in wire.recvs):
        src, dst, _ = key
        rs, rd = ranks[src], ranks[dst]
        sq, rq = wire.sends[key], wire.recvs[key]
        while sq and rq:
            sbuf, soff, sn = sq.pop(0)
            rbuf, roff, rn = rq.pop(0)
            matched = True
            rs.pending[(sbuf, dst)] -= 1
            rd.pending[(rbuf, src)] -= 1
            # The sender writes as soon as it has the receiver's RECV_READY: its send
            # completes even if the receiver's I/O thread dies on this message.
            rs.completions[(sbuf, "send")] = rs.completions.get((sbuf, "send"), 0) + 1
            wire.woken.add(src)
            if dst in newly_aborted:
                continue
            if sn > rn:
                newly_aborted.add(dst)
                if not rd.abort_detail:
                    rd.abort_from = (src, sn, rn)
                    rd.abort_detail = f"{receives_words(dst, src, sn, rn)} ({rd.label} vs {rs.label}): {size_enforce(sn, rn)}"
                continue
            if rd.bufs:
                rd.bufs[rbuf][roff: roff + sn] = rs.bufs[sbuf][soff: soff + sn]
            rd.completions[(rbuf, "recv")] = rd.completions.get((rbuf, "recv"), 0) + 1
            wire.woken.add(dst)
    return matched, newly_aborted


def size_enforce(sent: int, room: int) -> str:
    """What Gloo's I/O thread throws (`what()`) on a message of `sent` bytes into a receive of
    `room`, word for word (torch 2.13, `tests/test_script_abort_words.py`) but for its
    "[enforce fail at .../gloo/transport/tcp/pair.cc:456] " prefix, which the simulator's
    Gloo messages leave out. It names no rank."""
    return (f"op.preamble.length <= op.nbytes. {sent} vs {room}. Received data size doesn't match expected size. "
            f"Is there a distributed collective mismatch in your code?")


def receives_words(rank: int, src: int, sent: int, room: int) -> str:
    """The simulator's account of that abort, which Gloo does not give: who sent what to whom."""
    return f"rank {rank} receives {sent} bytes from rank {src} into a {room}-byte receive"


def _abort(st: RankRun, wire: _Wire) -> None:
    """The receiver's process is gone: what it had posted but not matched never will be."""
    st.aborted = True
    st.done = False
    wire.dead.add(st.rank)
    for key in list(wire.sends):
        if key[0] == st.rank:
            wire.sends[key] = []
    for key in list(wire.recvs):
        if key[1] == st.rank:
            wire.recvs[key] = []


def _diagnose(st: RankRun, dead: set[int]) -> None:
    """Why a rank stays blocked in waitSend/waitRecv: a buffer that still has an operation
    pending with a dead peer gets that pair's exception (Connection closed/reset by peer);
    one whose pending peers are alive (but stuck) times out, or fails when one of them goes."""
    step = st.prog[st.pc]
    buf = step[1]
    gone = sorted(p for (b, p), n in st.pending.items() if b == buf and n > 0 and p in dead)
    if gone:
        st.peer_error = True
        st.error_detail = f"waits on an operation pending with rank {gone[0]}, which is gone"
    else:
        peers = sorted(p for (b, p), n in st.pending.items() if b == buf and n > 0)
        what = "send" if step[0] == "wait_send" else "recv"
        st.waits_on = frozenset(peers)
        st.blocked_on = f"{what} (pending with rank(s) {peers})" if peers else what
