"""Links as FIFO servers on simpy (ASTRA-sim's congestion-aware analytical model).

Each direction of a link is one server: a message keeps it busy for size/bandwidth and
arrives at the far end latency later (the latency is propagation: the link is free
again while the bits fly). Messages queue in arrival order. A multi-hop route is store
and forward: the whole message crosses hop 1, then hop 2, ...
"""

from __future__ import annotations

from collections.abc import Generator

import simpy


class Link:
    """One direction of a link."""

    __slots__ = ("env", "name", "latency", "bandwidth", "server", "busy_time", "bytes")

    def __init__(self, env: simpy.Environment, name: str, latency_s: float, bandwidth_Bps: float):
        self.env = env
        self.name = name
        self.latency = latency_s
        self.bandwidth = bandwidth_Bps
        self.server = simpy.Resource(env, capacity=1)
        self.busy_time = 0.0
        self.bytes = 0

    def transmit(self, nbytes: float) -> Generator:
        """simpy process body: queue, serialize, propagate."""
        with self.server.request() as req:
            yield req
            t = nbytes / self.bandwidth
            self.busy_time += t
            self.bytes += int(nbytes)
            if t > 0:
                yield self.env.timeout(t)
        if self.latency > 0:
            yield self.env.timeout(self.latency)


class LinkSet:
    """The directed links of a `Network`, created lazily in one simpy environment."""

    def __init__(self, env: simpy.Environment, network):
        self.env = env
        self.net = network
        self.links: dict[tuple[str, str], Link] = {}

    def get(self, u: str, v: str) -> Link:
        link = self.links.get((u, v))
        if link is None:
            e = self.net.graph.edges[u, v]
            link = Link(self.env, f"{u}->{v}", e["latency_us"] * 1e-6, e["bandwidth_gbps"] * 1e9)
            self.links[(u, v)] = link
        return link

    def send(self, src_rank: int, dst_rank: int, nbytes: float) -> Generator:
        """simpy process body: store-and-forward along the route."""
        for u, v in self.net.route(src_rank, dst_rank):
            yield from self.get(u, v).transmit(nbytes)

    def utilization(self, horizon: float) -> dict[str, float]:
        return {link.name: (link.busy_time / horizon if horizon > 0 else 0.0) for link in self.links.values()}
