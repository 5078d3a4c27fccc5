"""Gloo's timeout inside the engine: the wait that ran out, and what it leaves of the group.

When a Gloo wait runs out (`UnboundBuffer::waitRecv`/`waitSend`), Gloo does not only fail
that wait: it calls `context->signalException("Application timeout caused pair closure")`,
which closes every pair of the rank's context, i.e. of that process group on that rank
(each group has its own context). Measured on torch 2.13, 3 ranks, timeout 2 s:

* the rank's other unfinished operations in the group, and every later one, fail with
  "Application timeout caused pair closure" (at once: a retry of the collective, or the
  next one, never reaches the wire);
* its peers' sockets to it are closed: their operations in the group that need it fail with
  "Connection closed by peer" (at once for one posted later: a rank that arrives at a
  collective after its peers timed out fails, it does not complete it nor time out itself);
  when two ranks time out together, which of the two messages a rank sees first is a race;
* the group's other ranks' messages among themselves and the rank's other groups are
  untouched; `destroy_process_group` works.

The driver decides when a wait runs out (`simdist.script.deadlines`); `awaits` tells it
which waits a rank that has not posted yet holds up.
"""

from __future__ import annotations

from collections import defaultdict, deque

from simdist.engine.calls import Call, Instance, P2PKey

PAIR_CLOSURE = "Application timeout caused pair closure"


def _peer_closed(rank: int) -> str:
    return f"Connection closed by peer (rank {rank} timed out)"


class GlooTimeouts:
    """Mixed into `core.Engine`; reads its groups, open collectives and p2p queues."""

    groups: dict[str, list[int]]
    _open: dict[str, dict[int, Instance]]
    _sends: dict[P2PKey, deque[Call]]
    _recvs: dict[P2PKey, deque[Call]]
    _any_recvs: dict[tuple[str, int, int], deque[Call]]
    _closed: defaultdict[str, set[int]]  # group -> ranks whose context Gloo's timeout closed

    def time_out(self, expired: list[tuple[Call, str]]) -> None:
        """Gloo's timeout: each call waited past its group's deadline and fails with its
        message; then each one's rank closes its context for the group (the module's
        docstring). Calls that run out together (`deadlines.TIE_S`) all time out first: a
        closure takes longer to reach a peer than the peer's own wait takes to end."""
        expired = [(c, m) for c, m in expired if not c.done]
        for call, message in expired:
            self._unqueue(call)
            if (inst := self._open[call.entry.group].get(call.entry.seq)) is not None and call.op not in ("send", "recv"):
                if not inst.matched and not inst.stuck:
                    self.note_waits(inst)  # whom the other posted calls wait on (`Call.waits_on`)
                inst.stuck = True
            self._fail(call, message, "timeout")
        for call, _ in expired:
            if call.ok is False:  # not one whose messages all went through meanwhile (`note_waits`)
                self._close(call.rank, call.entry.group)

    def _close(self, rank: int, group: str) -> None:
        self._closed[group].add(rank)
        for other in self._pending(group):
            if other.rank == rank:
                self._unqueue(other)
                self._fail(other, PAIR_CLOSURE, "timeout")
            elif self._involves(other, rank):
                self._unqueue(other)
                self._fail(other, _peer_closed(rank), "peer_lost")

    def closed_error(self, call: Call, group: str, peers: list[int]) -> tuple[str, str] | None:
        """For a call just posted in `group` with these peers: the failure a closed context
        gives it at once (message, category), None if its pairs are open."""
        closed = self._closed.get(group)
        if not closed:
            return None
        if call.rank in closed:
            return PAIR_CLOSURE, "timeout"
        gone = [p for p in peers if p in closed and p != call.rank]
        return (_peer_closed(min(gone)), "peer_lost") if gone else None

    def awaits(self, call: Call, rank: int) -> bool:
        """Whether `call` cannot complete before `rank` posts something it has not posted
        yet: a collective of `rank`'s group that `rank` has not reached, a send or receive
        with `rank` still unmatched. A receive from any source waits on no one rank."""
        if call.done:
            return False
        if call.op in ("send", "recv"):
            return call.entry.peer == rank and self._unmatched(call)
        inst = self._open[call.entry.group].get(call.entry.seq)
        return inst is not None and rank in inst.members and rank not in inst.calls

    # ------------------------------------------------------------------ helpers
    def note_waits(self, inst: Instance) -> None:
        raise NotImplementedError

    def _fail(self, call: Call, message: str, category: str) -> None:
        """Fail `call` with a RuntimeError of `message` (the engine's `RankRaised`)."""
        raise NotImplementedError

    def _queues(self) -> list[deque[Call]]:
        return [*self._sends.values(), *self._recvs.values(), *self._any_recvs.values()]

    def _unmatched(self, call: Call) -> bool:
        """Whether `call` (a p2p op) waits in a queue for its match. Not `_queued`: the
        engine core has a flag of that name, which would shadow this method."""
        return any(call in q for q in self._queues())

    def _unqueue(self, call: Call) -> None:
        for q in self._queues():
            if call in q:
                q.remove(call)

    def _pending(self, group: str) -> list[Call]:
        """The unfinished calls of `group`: its open collectives' and its unmatched p2p ops."""
        calls = [c for inst in self._open[group].values() for c in inst.calls.values() if not c.done]
        calls += [c for q in self._queues() for c in q if c.entry.group == group and not c.done]
        return calls

    def _involves(self, call: Call, rank: int) -> bool:
        """Whether `call` has a message pending with `rank` (a member of its collective, the
        peer of its p2p op): Gloo's closed pair fails exactly those. For a stuck collective
        whose Gloo messages are known that is `Call.waits_on` (as for a peer's exit: a rank
        blocked on a receive from another live peer waits for its own timeout)."""
        if call.op in ("send", "recv"):
            return call.entry.peer == rank
        if call.waits_on is not None:
            return rank in call.waits_on
        return rank in self.groups[call.entry.group]
