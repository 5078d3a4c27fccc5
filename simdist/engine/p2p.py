"""Point-to-point pairing in the engine: sends and receives matched FIFO per (group, src, dst, tag).

Kept apart from the core because p2p follows its own rule, not the collectives' per-group
sequence numbers: a send and a receive pair by queue order on their `calls.P2PKey` (never
across groups), a receive from any source takes the lowest waiting sender, and a size
mismatch is Gloo's tcp transport's (a longer message kills the receiver). The engine's
collective matching, failure and exit handling stay in `core.Engine`, which mixes this in.
"""

from __future__ import annotations

from collections import deque
from typing import Any

import simpy

from simdist.engine.calls import Call, P2PKey, RankState, Work
from simdist.engine.gloo_transport import receives_words, size_enforce
from simdist.engine.values import Payload
from simdist.report import Finding, TraceEntry


class GlooP2P:
    """Mixed into `core.Engine`; keeps its p2p queues (`_sends`, `_recvs`, `_any_recvs`) and
    fails or completes calls through the engine's `_fail_call` / `_fail` / `abort_rank`."""

    env: simpy.Environment
    groups: dict[str, list[int]]
    ranks: list[RankState]
    cost: Any
    findings: list[Finding]
    _closed: dict[str, set[int]]
    _gone_at: dict[int, float]
    _p2p_seq: dict[tuple[str, int], int]
    _sends: dict[P2PKey, deque[Call]]
    _recvs: dict[P2PKey, deque[Call]]
    _any_recvs: dict[tuple[str, int, int], deque[Call]]  # recvs from any source, per (group, dst, tag)

    def _record_one(self) -> None:
        raise NotImplementedError

    def _fail_call(self, call: Call, dead: int) -> None:
        raise NotImplementedError

    def _fail(self, call: Call, message: str, category: str) -> None:
        raise NotImplementedError

    def abort_rank(self, rank: int, what: str, why: str, fatal: TraceEntry | None = None) -> None:
        raise NotImplementedError

    def p2p(self, rank: int, op: str, payload: Payload, peer: int | None, *, tag: int, origin: str,
            group: str = "WORLD", t_issue: float | None = None) -> Work:
        """send (op='send', peer=dst) or recv (op='recv', peer=src); matched FIFO per (group,
        src, dst, tag) (`calls.P2PKey`: never across groups).
        A recv with `peer=None` takes a message from any source (`any_sender`); its trace
        entry names the source once matched. `t_issue`: when the rank posted it, on the clock
        of `rank_gone`'s `at` (a script's coordinator keeps the ranks' clocks; a scenario's
        ranks post now, the default): a call posted no later than its peer's process ended
        pairs with what the peer had posted, however late the engine hears of it
        (`_posted_before_gone`)."""
        rs = self.ranks[rank]
        self._record_one()
        self._p2p_seq[(group, rank)] += 1
        entry = TraceEntry(
            seq=self._p2p_seq[(group, rank)],
            op=op,
            numel=payload.numel,
            dtype=payload.dtype,
            group=group,
            group_size=len(self.groups[group]),
            origin=origin,
            peer=peer,
            async_op=False,
            phase=rs.phase,
            iteration=rs.iteration,
            t_issue=self.env.now,
        )
        rs.trace.append(entry)
        call = Call(rank, op, payload, None, None, entry, self.env, rs)
        if peer is None:
            peer = self.any_sender(group, rank, tag, self._sends)
            if peer is None:
                self._any_recvs[(group, rank, tag)].append(call)
                return call
            entry.peer = peer
        src, dst = (rank, peer) if op == "send" else (peer, rank)
        k = (group, src, dst, tag)
        # (`closed_error` is `timeouts.GlooTimeouts`', which the engine mixes in too)
        if self._closed and (shut := self.closed_error(call, group, [peer])) is not None:  # type: ignore[attr-defined]
            self._fail(call, *shut)
            return call
        mine, theirs = (self._sends, self._recvs) if op == "send" else (self._recvs, self._sends)
        posted = theirs[k] or (self._any_recvs[(group, dst, tag)] if op == "send" else theirs[k])
        if not self.ranks[peer].alive and not self._posted_before_gone(
                posted, peer, self.env.now if t_issue is None else t_issue):
            self._fail_call(call, peer)
            return call
        if not theirs[k] and op == "send" and self._any_recvs[(group, dst, tag)]:
            theirs[k].append(self._any_recvs[(group, dst, tag)].popleft())
            theirs[k][-1].entry.peer = rank
        if theirs[k]:
            other = theirs[k].popleft()
            send, recv = (call, other) if op == "send" else (other, call)
            self._match_p2p(send, recv)
        else:
            mine[k].append(call)
        return call

    def _posted_before_gone(self, theirs: deque[Call], peer: int, t_issue: float) -> bool:
        """Whether a call posted at `t_issue` to the gone `peer` meets the peer's own post
        (first in `theirs`, its queue of calls to this rank or, for a send, of receives from
        any source: `rank_gone` leaves the gone rank's posts queued) rather than its
        closed socket: it was posted before the peer's process ended. On Gloo the pair then
        exchanged its notices while both were up (the peer's receive notice reached the
        sender), whatever order the coordinator reads the two ranks' messages in."""
        return bool(theirs) and theirs[0].rank == peer and t_issue <= self._gone_at.get(peer, float("-inf"))

    @staticmethod
    def any_sender(group: str, dst: int, tag: int, sends: dict[P2PKey, deque]) -> int | None:
        """The source a receive from any source takes: of the ranks with a message waiting
        for `dst` on `tag` in `group`, the lowest (gloo looks through its pairs in rank order)."""
        return min((src for (g, src, d, t), q in sends.items() if g == group and d == dst and t == tag and q),
                   default=None)

    def _match_p2p(self, send: Call, recv: Call) -> None:
        """A send and a receive pair up whatever their sizes (gloo's tcp transport): a
        shorter message fills the front of the receive; a longer one kills the receiver
        when it arrives (``GLOO_ENFORCE_LE(op.preamble.length, op.nbytes)`` on its I/O
        thread: SIGABRT), while the sender's send completes (its bytes were written)."""
        sent, room = send.payload.nbytes, recv.payload.nbytes
        oversized = sent > room
        if oversized:
            self.findings.append(
                Finding("p2p_size_mismatch", send.entry.group, send.entry.seq, [send.rank, recv.rank],
                        f"rank {send.rank} sends {sent} B but rank {recv.rank} receives {room} B")
            )
        dur = self.cost.p2p_time(sent, send.rank, recv.rank)

        def finish(_ev: Any) -> None:
            for c in (send, recv) if not oversized else (send,):
                c.entry.t_done = self.env.now
                c.entry.completed = True
            send.settle(True, send.payload)
            if oversized:
                self.abort_rank(recv.rank, size_enforce(sent, room),
                                f"{receives_words(recv.rank, send.rank, sent, room)} (recv)", recv.entry)
            elif not recv.done:
                recv.settle(True, send.payload.reinterpret(recv.payload.dtype))

        self.env.timeout(dur).callbacks.append(finish)

    def _fail_p2p_of(self, rank: int) -> None:
        """`rank`'s process is gone (`rank_gone`): its peers' queued sends to it and receives
        from it fail; its own posts stay queued (`_posted_before_gone`)."""
        for queues in (self._sends, self._recvs):
            for (_group, src, dst, _tag), q in queues.items():
                if rank in (src, dst):
                    for c in list(q):
                        if c.rank != rank:
                            self._fail_call(c, rank)
                            q.remove(c)
