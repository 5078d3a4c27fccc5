"""Gloo's collectives timed from measured primitives: the real message programs executed
on a host whose ranks share its cores.

What runs is what ProcessGroupGloo runs (`simdist.collectives.gloo`: the segmented ring
all_reduce with two segments in flight, the ring all_gather in halves, the binomial
broadcast with its sends posted at once, all_to_all posted at once), wrapped in what torch
does around the Gloo call (`rank_program`: the fixed cost of the call, reduce_scatter's
clone and full all_reduce, all_gather's copy out). Costs come from a `HostProfile`:

  * a message between two ranks is one transfer per directed pair at a time (one TCP
    socket: Gloo writes a pair's messages in order) and starts when its send and its
    receive are both posted (Gloo's sender waits for the receiver's notice that the
    receive is posted). Alone it takes the measured one-way time `message_time(n)`;
  * a reduction takes n*gamma, a copy n*copy, the call `call_s`;
  * **cores are shared.** A moving message keeps `demand(n)` cores busy (the sender's
    write and the receiver's read), a reduction, copy or call one. With D cores wanted
    and C available, everything that is running advances at min(1, C/D) of its own speed
    (processor sharing, as the kernel's fair scheduler shares cores between runnable
    threads). A rank blocked in a wait wants no core. This is the term that makes 4
    ranks on 2 cores slower than the same messages on 4 cores; nothing is fitted to it.

A benchmark times calls back to back, so a rank that finishes early starts its next
call; `gloo_op_time` runs `ITERATIONS` calls and returns the steady period, which is
what a batch mean measures. Its closed forms (one core per busy thread, affine message
time, no reduction) are derived in docs/timing.md and checked by tests/test_gloo_time.py.
"""

from __future__ import annotations

from collections import defaultdict, deque
from dataclasses import dataclass

from simdist.collectives.gloo import allgather, alltoall, broadcast, ring_allreduce
from simdist.network.host import HostProfile

#: Ops this model times (torch names; reduce_scatter is reduce_scatter_tensor).
GLOO_TIMED_OPS = frozenset({"all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all"})
ITERATIONS = 4
ELEM = 4  # float32, what the benchmarks and DDP's buckets use


def rank_program(op: str, rank: int, p: int, nbytes: int, host: HostProfile) -> list[tuple]:
    """One call as one rank executes it: ``("cpu", seconds)`` work, Gloo's message steps,
    and ``("mark",)`` when the call returns. `nbytes` as `CostModel.collective_time`: the
    per-rank input (all_gather: each rank's contribution; reduce_scatter: the whole input)."""
    call = [("cpu", host.call_s)]
    if op == "all_reduce":
        body = ring_allreduce(rank, p, nbytes // ELEM, ELEM).steps
    elif op == "reduce_scatter":  # clone the input, all_reduce it whole, copy out this rank's chunk
        body = [("cpu", nbytes * host.copy), *ring_allreduce(rank, p, nbytes // ELEM, ELEM).steps,
                ("cpu", nbytes // p * host.copy)]
    elif op == "all_gather":  # gloo gathers into one flat tensor; torch copies it out to the list
        body = [*allgather(rank, p, nbytes).steps, ("cpu", p * nbytes * host.copy)]
    elif op == "broadcast":
        body = broadcast(rank, p, nbytes, 0).steps
    elif op == "all_to_all":  # the own block is a local copy
        body = [("cpu", nbytes // p * host.copy), *alltoall(rank, p, nbytes).steps]
    else:
        raise ValueError(f"op: the Gloo model times {', '.join(sorted(GLOO_TIMED_OPS))}, not {op!r}")
    return [*call, *body, ("mark",)]


def gloo_op_time(host: HostProfile, op: str, nbytes: int, p: int, iterations: int = ITERATIONS) -> float:
    """Seconds per call of `op` on `p` ranks called back to back: the steady period
    (last call's end - first call's end) / (iterations - 1), slowest rank."""
    if p <= 1:
        return host.call_s
    progs = [rank_program(op, r, p, nbytes, host) * iterations for r in range(p)]
    marks = HostRun(host, progs).run()
    ends = [max(m[k] for m in marks) for k in range(iterations)]
    if iterations == 1:
        return ends[0]
    return (ends[-1] - ends[0]) / (iterations - 1)


@dataclass
class _Work:
    """Something running: a message moving (`msg` set) or a rank's own computation."""

    left: float  # seconds still to do at full speed
    demand: float  # cores it keeps busy
    rank: int
    msg: tuple | None = None  # (src, dst, send buffer, recv buffer)


class HostRun:
    """Executes per-rank programs (`rank_program` steps, concatenated) on the host model."""

    def __init__(self, host: HostProfile, programs: list[list[tuple]]):
        self.host = host
        self.progs = programs
        self.p = len(programs)
        self.now = 0.0
        self.pc = [0] * self.p
        self.computing = [False] * self.p
        self.done: dict[tuple, int] = defaultdict(int)  # (rank, "send"/"recv", buf) -> completions
        self.used: dict[tuple, int] = defaultdict(int)  # ... -> completions a wait has taken
        self.sends: dict[tuple[int, int], deque] = defaultdict(deque)  # (src, dst) -> posted sends
        self.recvs: dict[tuple[int, int], deque] = defaultdict(deque)
        self.moving: set[tuple[int, int]] = set()  # pairs with a message on the way
        self.work: list[_Work] = []
        self.marks: list[list[float]] = [[] for _ in range(self.p)]

    def run(self) -> list[list[float]]:
        """Every rank's call-return times, in order."""
        for r in range(self.p):
            self._advance(r)
        while self.work:
            wanted = sum(w.demand for w in self.work)
            speed = min(1.0, self.host.cores / wanted)
            first = min(self.work, key=lambda w: w.left)
            step = first.left
            self.now += step / speed
            finished = []
            for w in self.work:
                w.left -= step
                if w.left <= 1e-15 + 1e-12 * step:
                    finished.append(w)
            gone = {id(w) for w in finished}
            self.work = [w for w in self.work if id(w) not in gone]
            for w in finished:
                self._finish(w)
        stuck = [r for r in range(self.p) if self.pc[r] < len(self.progs[r])]
        if stuck:
            raise RuntimeError(f"gloo model: ranks {stuck} never finished (unmatched messages)")
        return self.marks

    def _advance(self, r: int) -> None:
        """Run rank r's program until it waits or computes."""
        prog = self.progs[r]
        while self.pc[r] < len(prog) and not self.computing[r]:
            st = prog[self.pc[r]]
            kind = st[0]
            if kind in ("wait_send", "wait_recv"):
                key = (r, kind[5:], st[1])
                if self.done[key] <= self.used[key]:
                    return
                self.used[key] += 1
            elif kind == "send":
                self.sends[(r, st[2])].append((st[1], st[5]))
                self._start((r, st[2]))
            elif kind == "recv":
                self.recvs[(st[2], r)].append((st[1], st[5]))
                self._start((st[2], r))
            elif kind in ("cpu", "reduce"):
                secs = st[1] if kind == "cpu" else st[4] * self.host.gamma
                if secs > 0:
                    self.computing[r] = True
                    self.work.append(_Work(secs, 1.0, r))
            elif kind == "mark":
                self.marks[r].append(self.now)
            self.pc[r] += 1

    def _start(self, pair: tuple[int, int]) -> None:
        """Put the pair's next message on the way, if both ends posted it and the pair is free."""
        if pair in self.moving or not self.sends[pair] or not self.recvs[pair]:
            return
        (sbuf, n), (rbuf, _) = self.sends[pair].popleft(), self.recvs[pair].popleft()
        self.moving.add(pair)
        self.work.append(_Work(self.host.message_time(n), self.host.demand(n), pair[0], (*pair, sbuf, rbuf)))

    def _finish(self, w: _Work) -> None:
        if w.msg is None:
            self.computing[w.rank] = False
            self._advance(w.rank)
            return
        src, dst, sbuf, rbuf = w.msg
        self.done[(src, "send", sbuf)] += 1
        self.done[(dst, "recv", rbuf)] += 1
        self.moving.discard((src, dst))
        self._start((src, dst))
        self._advance(src)
        self._advance(dst)
