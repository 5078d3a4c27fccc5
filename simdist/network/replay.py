"""The step-level simulation without an event queue: steps replayed in order, each as
whole-array arithmetic.

The event executor (`simdist.network.events`) serves the messages that reach a link in
the order of the key (time, collective, step, message, hop). The replay serves each
link's messages in step order instead, hop by hop within a step, and (arrival, message)
within one hop. Where the two orders agree on every link, each link sees the same
messages in the same order, and since both executors compute every time with the same
additions (`simdist.network.links`), the times are identical, not merely close.

They agree when, on every link, the message that arrives next in step order never
arrives earlier than the one before it (the same time is fine if it is a later step,
which the key serves later too). The replay checks that as it goes and gives up (None)
at the first message that breaks it; then only the events can say what happens. It
holds when contention is the same in every step (the queue forms again each step, in
the same order), and whenever no link is shared within a step and ranks move in step.

Most links need no check at all: a link that only one rank sends into as the first hop
of its messages (its port on a switch), or that only one rank receives from as the last
hop, carries that rank's messages one step after the other, and a rank starts a step
only when its previous messages have arrived, so such a *private* link is always free
when a message reaches it: the message crosses it in size/bandwidth + latency. On a
non-blocking switch (loopback, switch8, uniform) every link is private.

Collectives that share a link interleave, so several collectives replay only over
disjoint links.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simdist.collectives.schedule import Pattern
from simdist.network.links import LinkState
from simdist.network.runs import CollectiveResult, Run, TransferLog

TAG = 1 << 16  # a link's last visitor as step * TAG + hop (routes are far shorter than TAG hops)


@dataclass(frozen=True)
class _Hop:
    """Hop h of a pattern's messages, as the replay serves it."""

    h: int
    sel: slice | np.ndarray  # the messages whose route has this hop
    link: np.ndarray
    bandwidth: np.ndarray
    latency: np.ndarray
    private: bool  # every link here is private (see the module docstring): no state, no check
    unique: bool  # no link twice among these messages


def replay(runs: list[Run], links: LinkState, gamma: float, record: bool,
           busy: bool = False) -> list[CollectiveResult] | None:
    """Every run's result, or None when some link would be reached out of step order.
    `busy`: add up each link's busy time (for utilization), in the order it serves."""
    used: set[int] = set()
    for run in runs if len(runs) > 1 else ():
        mine = run.links()
        if mine & used:
            return None
        used |= mine
    results = []
    for run in runs:
        res = _replay_run(run, links, gamma, record, busy)
        if res is None:
            return None
        results.append(res)
    return results


def _replay_run(run: Run, links: LinkState, gamma: float, record: bool, busy: bool) -> CollectiveResult | None:
    s = run.schedule
    plans = _plans(run)
    ready = np.full(s.p, float(run.request.start))
    begins: list[np.ndarray] = []
    ends: list[np.ndarray] = []
    for k, step in enumerate(s.steps):
        pattern = step.pattern
        begin = np.maximum(ready[pattern.src], ready[pattern.dst])
        t = begin
        for hop in plans[id(pattern)]:
            if hop.private and hop.unique and not busy:
                ser = step.count[hop.sel] / hop.bandwidth
                if isinstance(hop.sel, slice):
                    t = t + ser + hop.latency
                else:
                    t = t.copy()
                    t[hop.sel] = t[hop.sel] + ser + hop.latency
            else:
                t = t.copy()
                if not _serve(links, hop, k, t, step.count, busy):
                    return None
        if gamma > 0:
            reduced = step.reduce & (step.count > 0)
            if reduced.all():
                t = t + step.count * gamma
            elif reduced.any():
                t = np.where(reduced, t + step.count * gamma, t)
        ready = _advance(ready, pattern, t)
        if record:
            begins.append(begin)
            ends.append(t)
    if busy:
        for routes in run.routes.values():
            links.used[routes.hops[routes.hops >= 0]] = True
    log = TransferLog.from_steps(run.index, s, run.ranks, begins, ends) if record else None
    return run.result(ready, log)


def _serve(links: LinkState, hop: _Hop, k: int, t: np.ndarray, count: np.ndarray, busy: bool) -> bool:
    """Serve hop `hop.h` of step k's messages (arriving at `t`, updated to the next
    arrival) on the links' queues. False when a link is reached out of the event order."""
    if not hop.unique:
        return _serve_one_by_one(links, hop, k, t, count, busy)
    link, arrival = hop.link, t[hop.sel]
    prev = links.arrived[link]
    if not hop.private and not ((arrival > prev) | ((arrival == prev) & (links.tag[link] < k * TAG))).all():
        return False
    ser = count[hop.sel] / hop.bandwidth
    end = np.maximum(arrival, links.free_at[link]) + ser
    links.free_at[link] = end
    if busy:
        links.busy[link] += ser
    links.arrived[link] = arrival
    links.tag[link] = k * TAG + hop.h
    t[hop.sel] = end + hop.latency
    return True


def _serve_one_by_one(links: LinkState, hop: _Hop, k: int, t: np.ndarray, count: np.ndarray, busy: bool) -> bool:
    """`_serve` where messages of this hop share a link: each link's queue in (arrival, message) order."""
    idx = np.arange(len(t))[hop.sel]
    order = np.lexsort((idx, t[idx]))
    tag_now = k * TAG + hop.h
    for j in order.tolist():
        m, link = int(idx[j]), int(hop.link[j])
        arrival, prev, tag = float(t[m]), links.arrived[link], links.tag[link]
        if not (arrival > prev or (arrival == prev and (tag < k * TAG or tag == tag_now))):
            return False
        n = int(count[m])
        ser = n / float(hop.bandwidth[j])
        end = max(arrival, float(links.free_at[link])) + ser
        links.free_at[link] = end
        if busy:
            links.busy[link] += ser
        links.arrived[link], links.tag[link] = arrival, tag_now
        t[m] = end + float(hop.latency[j])
    return True


def _advance(ready: np.ndarray, pattern: Pattern, done: np.ndarray) -> np.ndarray:
    """Each rank's time after the step: the last of its messages (or as before, if none)."""
    new = ready.copy()
    if pattern.one_per_rank:
        new[pattern.src] = np.maximum(new[pattern.src], done)
        new[pattern.dst] = np.maximum(new[pattern.dst], done)
    else:
        np.maximum.at(new, pattern.src, done)
        np.maximum.at(new, pattern.dst, done)
    return new


# --------------------------------------------------------------------------- plans
def _plans(run: Run) -> dict[int, list[_Hop]]:
    """Per pattern of the run, its hops as the replay serves them."""
    private = _private_links(run)
    plans = {}
    for key, r in run.routes.items():
        hops = []
        for h in range(r.hops.shape[0]):
            sel: slice | np.ndarray = slice(None) if r.dense[h] else np.flatnonzero(r.hops[h] >= 0)
            link = r.hops[h][sel]
            hops.append(_Hop(h, sel, link, r.bandwidth[h][sel], r.latency[h][sel], bool(private[link].all()),
                             r.unique[h]))
        plans[key] = hops
    return plans


def _private_links(run: Run) -> np.ndarray:
    """Per link number: does only one rank send into it as its messages' first hop, or only
    one rank receive from it as their last hop?"""
    size = 1 + max((int(r.hops.max(initial=-1)) for r in run.routes.values()), default=-1)
    uses = []  # (link, hop is first, hop is last, sender, receiver) for every hop of every pattern
    for r in run.routes.values():
        pattern = r.pattern
        for h in range(r.hops.shape[0]):
            on = r.hops[h] >= 0
            uses.append((r.hops[h][on], np.full(int(on.sum()), h == 0), (r.lengths - 1 == h)[on], pattern.src[on],
                         pattern.dst[on]))
    if not uses:
        return np.zeros(size, dtype=np.bool_)
    link, first, last, src, dst = (np.concatenate(c) for c in zip(*uses, strict=True))
    return _all_by(link, first, size) & _one_value(link, src, size) | _all_by(link, last, size) & _one_value(link, dst, size)


def _all_by(link: np.ndarray, flag: np.ndarray, size: int) -> np.ndarray:
    """Per link: is `flag` true for all its uses?"""
    return np.bincount(link, weights=~flag, minlength=size) == 0


def _one_value(link: np.ndarray, value: np.ndarray, size: int) -> np.ndarray:
    """Per link: do all its uses have the same `value`?"""
    lo = np.full(size, np.iinfo(np.int64).max)
    hi = np.full(size, np.iinfo(np.int64).min)
    np.minimum.at(lo, link, value)
    np.maximum.at(hi, link, value)
    return lo == hi
