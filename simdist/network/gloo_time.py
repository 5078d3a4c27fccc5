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
  * a reduction takes n*gamma, a copy `copy_time(n)`, writing a buffer allocated for the
    call `fresh_time(n)` (page faults), the call `call_s`; a message's bytes cost per byte
    the mean of what a message of each end's buffer costs (`byte_time` with the sender's
    and the receiver's buffer size, `buffers`): the sender reads its buffer, the receiver
    writes its own, and a 1 MiB ring segment of a 48 MiB tensor is read from memory but
    lands, in the reduce-scatter phase, in a two-segment scratch that stays in cache;
  * **cores are shared.** A moving message keeps `demand(n)` cores busy (the sender's
    write and the receiver's read), a reduction, copy or call one. With D cores wanted
    and C available, everything that is running advances at min(1, C/D) of its own speed
    (processor sharing, as the kernel's fair scheduler shares cores between runnable
    threads). A rank blocked in a wait wants no core. This is the term that makes 4
    ranks on 2 cores slower than the same messages on 4 cores; nothing is fitted to it;
  * **a wake-up** (a message delivered: the receiver woken, its wait returning) is work on
    one core. While every rank has a core (p <= cores) it takes the latency and serves
    every message that reaches the rank while it runs (Gloo's loop thread reads what is
    waiting in one wake-up; a worker whose receive already completed does not sleep).
    When ranks outnumber cores they take turns: each message is a turn of its own that
    holds a core for `turn_time(host, p)`, the turn that makes the model's own p2p ring
    step take the measured one (`HostProfile.ring_s`), as the two-in-flight time prices
    the bytes' cores (`HostProfile.demand`).

A benchmark times calls back to back, so a rank that finishes early starts its next
call; `gloo_op_time` runs `ITERATIONS` calls and returns the steady period, which is
what a batch mean measures. Its closed forms (one core per busy thread, affine message
time, no reduction) are derived in docs/timing.md and checked by tests/test_gloo_time.py.
"""

from __future__ import annotations

import heapq
import itertools
import math
from collections import defaultdict, deque
from collections.abc import Callable
from dataclasses import dataclass

from simdist.collectives.gloo import allgather, alltoall, broadcast, ring_allreduce, ring_segments
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
        body = [("cpu", host.fresh_time(nbytes)), *ring_allreduce(rank, p, nbytes // ELEM, ELEM).steps,
                ("cpu", host.copy_time(nbytes // p))]
    elif op == "all_gather":  # gloo gathers into a new flat tensor; torch copies it out to the list
        body = [*allgather(rank, p, nbytes).steps, ("cpu", host.fresh_time(p * nbytes) - host.copy_time(p * nbytes)),
                ("cpu", host.copy_time(p * nbytes))]
    elif op == "broadcast":
        body = broadcast(rank, p, nbytes, 0).steps
    elif op == "all_to_all":  # the own block is a local copy
        body = [("cpu", host.copy_time(nbytes // p)), *alltoall(rank, p, nbytes).steps]
    else:
        raise ValueError(f"op: the Gloo model times {', '.join(sorted(GLOO_TIMED_OPS))}, not {op!r}")
    return [*call, *body, ("mark",)]


def gloo_op_time(host: HostProfile, op: str, nbytes: int, p: int, iterations: int = ITERATIONS) -> float:
    """Seconds per call of `op` on `p` ranks called back to back: the steady period
    (last call's end - first call's end) / (iterations - 1), slowest rank."""
    if p <= 1:
        return host.call_s
    progs = [rank_program(op, r, p, nbytes, host) * iterations for r in range(p)]
    marks = HostRun(host, progs, buffers(op, nbytes, p)).run()
    ends = [max(m[k] for m in marks) for k in range(iterations)]
    if iterations == 1:
        return ends[0]
    return (ends[-1] - ends[0]) / (iterations - 1)


def turn_time(host: HostProfile, p: int) -> float:
    """Seconds of one core that a wake-up holds on `p` ranks (docs/timing.md, "Ranks taking
    turns"): the latency while every rank has a core; above, the turn the measured p2p ring
    step implies. In that step (`HostProfile.ring_s`) every rank sends one message to the
    next and receives one, so the model runs it as a notice (the latency, a wait) and then p
    wake-ups sharing the cores: R(p) = latency + p*turn/cores, i.e. turn = (R(p) - latency) *
    cores / p, and never less than the latency (a turn is at least a wake-up). World sizes
    between the measured ones are interpolated linearly in p from (cores, latency); above the
    largest measured, its turn (the ring step keeps growing as p/cores); a calibration
    without `ring_s` gives the latency (the model before ring steps were measured)."""
    a, c = host.latency, host.cores
    if p <= c:
        return a
    pts = [(c, a)] + sorted((int(k), max(a, (r - a) * c / int(k))) for k, r in host.ring_s.items() if int(k) > c)
    for (x0, y0), (x1, y1) in itertools.pairwise(pts):
        if p <= x1:
            return y0 + (y1 - y0) * (p - x0) / (x1 - x0)
    return pts[-1][1]


def buffers(op: str, nbytes: int, p: int) -> dict[str, int]:
    """Bytes of each buffer a call's messages are read from or written into (see
    `HostProfile.byte_time`): the tensor ("out"; all_gather's p*n flat output), all_to_all's
    input ("in"), and the ring all_reduce's scratch ("tmp": two segments, cache-resident)."""
    out = p * nbytes if op == "all_gather" else nbytes
    return {"out": out, "in": nbytes, "tmp": 2 * ring_segments(nbytes, p)[1] if p > 1 else 0, "zero": 0}


@dataclass
class _Work:
    """Something using cores: a message's bytes or its delivery, or a rank computing."""

    left: float  # seconds still to do at full speed
    demand: float  # cores it keeps busy
    then: Callable[..., None]  # called with `args` when done
    args: tuple


class HostRun:
    """Executes per-rank programs (`rank_program` steps, concatenated) on the host model.

    Two kinds of things take time: work (`_Work`: bytes through a socket, a message's
    delivery, a reduction, a copy, a call), which shares the cores, and waiting (a
    receiver's notice reaching the sender), which does not."""

    def __init__(self, host: HostProfile, programs: list[list[tuple]], sizes: dict[str, int] | None = None):
        self.host = host
        self.sizes = sizes or {}
        self.progs = programs
        self.p = len(programs)
        self.now = 0.0
        self.pc = [0] * self.p
        self.computing = [False] * self.p
        self.done: dict[tuple, int] = defaultdict(int)  # (rank, "send"/"recv", buf) -> completions
        self.used: dict[tuple, int] = defaultdict(int)  # ... -> completions a wait has taken
        self.sends: dict[tuple[int, int], deque] = defaultdict(deque)  # (src, dst) -> posted sends
        self.recvs: dict[tuple[int, int], deque] = defaultdict(deque)  # ... -> (seen by sender at, buf)
        self.moving: set[tuple[int, int]] = set()  # pairs whose socket is copying a message
        self.work: list[_Work] = []
        self.waits: list[tuple] = []  # heap of (time, seq, what, args)
        self.seq = 0
        self.marks: list[list[float]] = [[] for _ in range(self.p)]
        # while every rank has a core, a wake-up serves every message that reaches its rank
        # while it runs (rank -> the buffers it delivers); with more ranks than cores each
        # message is a turn of its own (`turn_time`)
        self.share = self.p <= host.cores
        self.turn = turn_time(host, self.p)
        self.waking: dict[int, list[str]] = {}

    def run(self) -> list[list[float]]:
        """Every rank's call-return times, in order."""
        for r in range(self.p):
            self._advance(r)
        while self.work or self.waits:
            speed = min(1.0, self.host.cores / sum(w.demand for w in self.work)) if self.work else 1.0
            first = min(self.work, key=lambda w: w.left) if self.work else None
            t_work = self.now + first.left / speed if first is not None else math.inf
            if self.waits and self.waits[0][0] <= t_work:
                t, _, what, args = heapq.heappop(self.waits)
                self._progress((t - self.now) * speed, t, exact=None)
                what(*args)
            else:
                assert first is not None
                self._progress(first.left, t_work, exact=first)
        stuck = [r for r in range(self.p) if self.pc[r] < len(self.progs[r])]
        if stuck:
            raise RuntimeError(f"gloo model: ranks {stuck} never finished (unmatched messages)")
        return self.marks

    def _progress(self, step: float, until: float, exact: _Work | None) -> None:
        """Every running work does `step` seconds of itself; the time is now `until`."""
        self.now = max(self.now, until)
        finished = []
        for w in self.work:
            w.left -= step
            if w is exact or w.left <= 1e-15 + 1e-12 * step:
                finished.append(w)
        if finished:
            gone = {id(w) for w in finished}
            self.work = [w for w in self.work if id(w) not in gone]
            for w in finished:
                w.then(*w.args)

    def _after(self, delay: float, what, *args) -> None:
        self.seq += 1
        heapq.heappush(self.waits, (self.now + delay, self.seq, what, args))

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
            elif kind == "recv":  # Gloo's receiver tells the sender; the notice takes a latency
                self.recvs[(st[2], r)].append((self.now + self.host.latency, st[1]))
                self._after(self.host.latency, self._start, (st[2], r))
            elif kind in ("cpu", "reduce"):
                secs = st[1] if kind == "cpu" else st[4] * self.host.gamma
                if secs > 0:
                    self.computing[r] = True
                    self.work.append(_Work(secs, 1.0, self._computed, (r,)))
            elif kind == "mark":
                self.marks[r].append(self.now)
            self.pc[r] += 1

    def _start(self, pair: tuple[int, int]) -> None:
        """Put the pair's next message on its socket, if the sender posted it, knows the
        receive is posted, and the socket is free."""
        if pair in self.moving or not self.sends[pair] or not self.recvs[pair]:
            return
        if self.recvs[pair][0][0] > self.now + 1e-15:
            return  # the notice is on its way; its arrival calls _start again
        (sbuf, n), (_, rbuf) = self.sends[pair].popleft(), self.recvs[pair].popleft()
        self.moving.add(pair)
        secs = (self.host.byte_time(n, self.sizes.get(sbuf, 0)) + self.host.byte_time(n, self.sizes.get(rbuf, 0))) / 2
        # each end copies the bytes once (the sender's write, the receiver's read): half the
        # message's byte time each, priced at the size of the buffer that end touches
        if secs > 0:
            self.work.append(_Work(secs, self.host.demand(n), self._sent, (pair, sbuf, rbuf)))
        else:  # through at once; not from here, which may be inside the sender's _advance
            self._after(0.0, self._sent, pair, sbuf, rbuf)

    def _computed(self, r: int) -> None:
        self.computing[r] = False
        self._advance(r)

    def _sent(self, pair: tuple[int, int], sbuf: str, rbuf: str) -> None:
        """The bytes are through the socket: the send is complete and the socket free; the
        delivery (the receiver woken, its wait returning) is a wake-up, work on one core
        (`turn`), which overlaps the pair's next message. While every rank has a core, a
        message whose bytes end while a wake-up of its receiver runs is delivered by it."""
        src, dst = pair
        self.done[(src, "send", sbuf)] += 1
        self.moving.discard(pair)
        if self.share and dst in self.waking:
            self.waking[dst].append(rbuf)
        else:
            bufs = [rbuf]
            if self.share:
                self.waking[dst] = bufs
            self.work.append(_Work(self.turn, 1.0, self._received, (dst, bufs)))
        self._start(pair)
        self._advance(src)

    def _received(self, dst: int, bufs: list[str]) -> None:
        if self.waking.get(dst) is bufs:
            del self.waking[dst]
        for rbuf in bufs:
            self.done[(dst, "recv", rbuf)] += 1
        self._advance(dst)
