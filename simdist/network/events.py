"""The step-level simulation with an event queue: message arrivals at links in time order.

An event is a message reaching hop h of its route (h = the route's length: it arrived).
Events are processed in the order of the key (time, collective, step, message, hop),
which is also how ties are broken: at the same instant, a message of an earlier step
(or an earlier message of the same step) reaches a shared link first. Every event
creates only events with a larger key, so the queue hands them out in exactly that
order.

Dependencies cost nothing to track: each rank counts the messages of its current step
still to finish; when that reaches zero it moves to its next step, and a message starts
when the second of its two ends got there. Every message is handled a fixed number of
times (once per hop, plus its end), so the work is linear in the messages; the former
executor nested a simpy condition per rank and step, and its bookkeeping grew with the
cube of the ranks.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from simdist.network.links import LinkState
from simdist.network.runs import CollectiveResult, Run, TransferLog


@dataclass
class _Flat:
    """One run's messages in schedule order, and for every rank its messages step by step."""

    src: list[int]
    dst: list[int]
    step: list[int]
    index: list[int]  # position within its step
    count: list[int]
    reduce: list[bool]
    route: list[tuple[int, ...]]
    members: list[int]  # message numbers, grouped by (rank, step)
    group_start: list[int]  # per group, its slice of `members`
    group_end: list[int]
    first_group: list[int]  # per rank, its groups are first_group[r] .. end_group[r] - 1
    end_group: list[int]

    @classmethod
    def of(cls, run: Run) -> _Flat:
        steps = run.schedule.steps
        p = run.schedule.p
        if not steps:
            empty = np.zeros(p, dtype=np.int64).tolist()
            return cls([], [], [], [], [], [], [], [], [], [], empty, empty)
        src = np.concatenate([st.src for st in steps])
        dst = np.concatenate([st.dst for st in steps])
        step = np.concatenate([np.full(len(st), k) for k, st in enumerate(steps)])
        lists = {key: r.lists() for key, r in run.routes.items()}
        route = [r for st in steps for r in lists[id(st.pattern)]]
        ends = np.concatenate([src, dst])
        msg = np.concatenate([np.arange(len(src))] * 2)
        order = np.lexsort((msg, ends))  # by rank, then message (so by step)
        rank_s, step_s = ends[order], step[msg[order]]
        new = np.ones(len(order), dtype=bool)
        new[1:] = (rank_s[1:] != rank_s[:-1]) | (step_s[1:] != step_s[:-1])
        starts = np.flatnonzero(new)
        group_rank = rank_s[starts]
        ranks = np.arange(p)
        return cls(
            src.tolist(), dst.tolist(), step.tolist(),
            np.concatenate([np.arange(len(st)) for st in steps]).tolist(),
            np.concatenate([st.count for st in steps]).tolist(),
            np.concatenate([st.reduce for st in steps]).tolist(),
            route, msg[order].tolist(), starts.tolist(), np.append(starts[1:], len(order)).tolist(),
            np.searchsorted(group_rank, ranks, "left").tolist(), np.searchsorted(group_rank, ranks, "right").tolist(),
        )


class _RunState:
    """Where each rank of one run stands, and when each of its messages began and ended."""

    def __init__(self, c: int, run: Run, heap: list):
        self.c = c
        self.run = run
        self.f = _Flat.of(run)
        self.heap = heap
        n = len(self.f.src)
        self.need = [2] * n  # ends still to reach the message's step
        self.begin = [0.0] * n
        self.end = [0.0] * n
        p = run.schedule.p
        self.group = list(self.f.first_group)
        self.left = [0] * p  # messages of the rank's current step still unfinished
        self.finish = [float(run.request.start)] * p

    def enter(self, r: int, now: float) -> None:
        """Rank r finished its previous step at `now`: it starts its next one (if any)."""
        f = self.f
        g = self.group[r]
        if g == f.end_group[r]:
            self.finish[r] = now
            return
        lo, hi = f.group_start[g], f.group_end[g]
        self.left[r] = hi - lo
        need = self.need
        for m in f.members[lo:hi]:
            need[m] -= 1
            if need[m] == 0:
                self.begin[m] = now
                heapq.heappush(self.heap, (now, self.c, f.step[m], f.index[m], 0, m))

    def done(self, m: int, now: float) -> None:
        self.end[m] = now
        for r in (self.f.src[m], self.f.dst[m]):
            self.left[r] -= 1
            if self.left[r] == 0:
                self.group[r] += 1
                self.enter(r, now)


def run_events(runs: list[Run], links: LinkState, gamma: float, record: bool) -> list[CollectiveResult]:
    """Every run's result, the runs sharing links with each other."""
    heap: list[tuple] = []
    states = [_RunState(c, run, heap) for c, run in enumerate(runs)]
    for st in states:
        for r in range(st.run.schedule.p):
            st.enter(r, st.finish[r])
    free_at, busy = links.free_at.tolist(), links.busy.tolist()
    bandwidth, latency = links.bandwidth.tolist(), links.latency.tolist()
    reached = set()
    while heap:
        now, c, k, i, h, m = heapq.heappop(heap)
        st = states[c]
        f = st.f
        route = f.route[m]
        if h < len(route):
            link = route[h]
            reached.add(link)
            n = f.count[m]
            ser = n / bandwidth[link]
            start = now if now >= free_at[link] else free_at[link]
            end = start + ser
            free_at[link] = end
            busy[link] += ser
            heapq.heappush(heap, (end + latency[link], c, k, i, h + 1, m))
        elif h == len(route) and f.reduce[m] and f.count[m] and gamma > 0:
            heapq.heappush(heap, (now + f.count[m] * gamma, c, k, i, h + 1, m))
        else:
            st.done(m, now)
    links.free_at[:], links.busy[:] = free_at, busy
    links.used[list(reached)] = True
    return [st.run.result(np.array(st.finish), _log(st) if record else None) for st in states]


def _log(st: _RunState) -> TransferLog:
    f = st.f
    ranks = st.run.ranks
    return TransferLog(st.run.index, st.run.schedule.phases, step=f.step, src=ranks[np.array(f.src, dtype=np.int64)],
                       dst=ranks[np.array(f.dst, dtype=np.int64)], nbytes=f.count, reduce=f.reduce, begin=st.begin,
                       end=st.end)
