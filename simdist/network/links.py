"""Links as FIFO servers (ASTRA-sim's congestion-aware analytical model), and the routes
of a step's messages over them.

Each direction of a link is one server: a message keeps it busy for size/bandwidth and
arrives at the far end latency later (the latency is propagation: the link is free
again while the bits fly). Messages are served in the order they reach the link. A
multi-hop route is store and forward: the whole message crosses hop 1, then hop 2, ...

A single FIFO server needs no queue object: the message that reaches it at time a starts
at max(a, the time the link frees), so a link is its `free_at` time, and every executor
(`simdist.network.events`, `simdist.network.replay`) computes the same sums in the same
order:

    start = max(arrival, free_at);  free_at = start + nbytes / bandwidth;
    arrival at the next hop = free_at + latency;  done = last arrival (+ nbytes * gamma).
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from simdist.collectives.schedule import Pattern
from simdist.network.routing import LinkIndex


class LinkState:
    """What the links of one simulation hold: when each frees, and its totals. Arrays
    indexed by `LinkIndex` numbers; `arrived`/`tag` remember the last message that
    reached each link (for `replay`'s order check), `used` which links carried anything."""

    def __init__(self, index: LinkIndex):
        n = len(index)
        self.index = index
        self.latency = np.array(index.latency_s, dtype=np.float64)
        self.bandwidth = np.array(index.bandwidth_Bps, dtype=np.float64)
        self.free_at = np.full(n, -np.inf)
        self.busy = np.zeros(n)
        self.arrived = np.full(n, -np.inf)
        self.tag = np.full(n, -1, dtype=np.int64)  # which step and hop of a route the last one was
        self.used = np.zeros(n, dtype=np.bool_)

    def utilization(self, horizon: float) -> dict[str, float]:
        """Busy share of `horizon` per link that carried something."""
        return {self.index.names[i]: (float(self.busy[i]) / horizon if horizon > 0 else 0.0)
                for i in np.flatnonzero(self.used).tolist()}


@dataclass(frozen=True)
class Routes:
    """The links of every message of one pattern, for one placement of its ranks, with
    each hop's bandwidth and latency (absent hops: -1, bandwidth 1, latency 0)."""

    pattern: Pattern
    hops: np.ndarray  # (max hops, messages): link number of each hop, -1 past a route's end
    lengths: np.ndarray  # hops per message
    bandwidth: np.ndarray  # (max hops, messages), bytes/s
    latency: np.ndarray  # (max hops, messages), seconds
    dense: list[bool]  # per hop: every message has that hop
    unique: list[bool]  # per hop: no link is the hop of two messages

    @classmethod
    def of(cls, pattern: Pattern, ranks: np.ndarray, index: LinkIndex) -> Routes:
        hops = index.routes(ranks[pattern.src], ranks[pattern.dst])
        present = hops >= 0
        bandwidth = np.where(present, np.array(index.bandwidth_Bps + [1.0])[hops], 1.0)
        latency = np.where(present, np.array(index.latency_s + [0.0])[hops], 0.0)
        unique = [int(np.bincount(row[row >= 0], minlength=1).max()) <= 1 for row in hops]
        return cls(pattern, hops, present.sum(axis=0), bandwidth, latency, [bool(x.all()) for x in present], unique)

    def lists(self) -> list[tuple[int, ...]]:
        """The route of each message as a tuple of link numbers (the event executor)."""
        return [tuple(x for x in col if x >= 0) for col in self.hops.T.tolist()]

    def links(self) -> set[int]:
        return set(np.unique(self.hops[self.hops >= 0]).tolist())
