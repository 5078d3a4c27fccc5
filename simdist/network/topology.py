"""Topologies as networkx graphs: presets, scenario topologies, routing.

Every rank becomes a graph node ``rank<i>``. A rank placed alone on a scenario node *is*
that node (the node's links are the rank's links). Ranks sharing a node (several
processes on one host) each get their own port: a link ``rank<i> -- node`` with the
node's intra-node latency and bandwidth (`INTRA_NODE`), so two ranks on one host talk
through the host, and a rank's sends share its port.

Links are bidirectional; each direction is a separate FIFO server (see links.py).
Routes are shortest paths by latency (ties: fewer hops, then name order) and are
store-and-forward: a route's alpha is the sum of its latencies, its beta the sum of
1/bandwidth over its hops.

Bandwidths are in gigabytes per second (1e9 bytes/s), latencies in microseconds, as in
the scenario's `TopoLink`.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from functools import lru_cache

import networkx as nx
import numpy as np

from simdist.errors import ScenarioError
from simdist.network.routing import FEW_PAIRS, LinkIndex, Router
from simdist.vocab import PRESET_MAX_WORLD, PRESETS

# Per-hop defaults (latency us, bandwidth GB/s). Ranks on one host talk through it.
INTRA_NODE = {"host": (15.0, 6.0), "gpu": (1.0, 300.0), "switch": (1.0, 300.0), "nic": (1.0, 64.0)}

# Reduction cost (s/byte) by where ranks run: a CPU core adds ~2.5 GB/s of float32 in
# Gloo's scalar loop; a GPU reduces at hundreds of GB/s.
GAMMA_CPU = 1 / 2.5e9
GAMMA_GPU = 1 / 500e9


@dataclass
class Network:
    """A routed topology for `world_size` ranks."""

    graph: nx.Graph
    world_size: int
    rank_node: dict[int, str]
    gamma: float
    name: str = "custom"
    _routes: dict[tuple[int, int], tuple[tuple[str, str], ...]] = field(default_factory=dict, repr=False)
    _router: Router | None = field(default=None, repr=False)
    _links: LinkIndex | None = field(default=None, repr=False)

    def route(self, src: int, dst: int) -> tuple[tuple[str, str], ...]:
        """Directed hops (u, v) from rank src to rank dst."""
        key = (src, dst)
        r = self._routes.get(key)
        if r is None:
            a, b = self.rank_node[src], self.rank_node[dst]
            if a == b:
                r = ()
            else:
                path = self.router.path(a, b)
                r = tuple(zip(path[:-1], path[1:], strict=False))
            self._routes[key] = r
        return r

    @property
    def router(self) -> Router:
        if self._router is None:
            self._router = Router(self.graph)
        return self._router

    @property
    def links(self) -> LinkIndex:
        """Every directed link a route has used so far, numbered (see `LinkIndex`)."""
        if self._links is None:
            self._links = LinkIndex(self)
        return self._links

    def link(self, u: str, v: str) -> dict:
        return self.graph.edges[u, v]

    def pair_cost(self, src: int, dst: int) -> tuple[float, float]:
        """(alpha seconds, beta seconds/byte) of the store-and-forward route src -> dst."""
        return _pair_cost(self, src, dst)

    def pair_costs(self, src: np.ndarray, dst: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """`pair_cost` for many pairs at once (rank arrays), with the same sums in the same
        order: alpha adds each hop's latency, beta each hop's 1/bandwidth, from the first hop."""
        if len(src) <= FEW_PAIRS:  # the arrays cost more than they save
            pairs = [self.pair_cost(a, b) for a, b in zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), strict=True)]
            return np.array([a for a, _ in pairs], dtype=np.float64), np.array([b for _, b in pairs], dtype=np.float64)
        hops = self.links.routes(src, dst)
        index = self.links
        latency = np.array(index.latency_s + [0.0])[hops]
        inverse = 1.0 / np.array(index.bandwidth_Bps + [np.inf])[hops]
        alpha = np.zeros(hops.shape[1])
        beta = np.zeros(hops.shape[1])
        for h in range(hops.shape[0]):
            alpha = alpha + latency[h]  # an absent hop adds 0.0: the sum is unchanged
            beta = beta + inverse[h]
        return alpha, beta

    def is_uniform(self) -> bool:
        """True when every ordered pair of distinct ranks has the same (alpha, beta)."""
        p = self.world_size
        if p <= 2:
            return True
        # Cheap check: same-shaped routes from rank 0 and from a middle rank.
        first = self.pair_cost(0, 1)
        probes = {(i, j) for i in (0, p // 2, p - 1) for j in range(p) if i != j}
        return all(_close(self.pair_cost(i, j), first) for i, j in probes)

    def uniform_params(self) -> tuple[float, float]:
        return self.pair_cost(0, 1) if self.world_size > 1 else (0.0, 0.0)

    def shared_copy(self) -> Network:
        """The same topology with its own rank placement and gamma, sharing what routing
        has found (routes do not depend on either)."""
        return Network(self.graph, self.world_size, dict(self.rank_node), self.gamma, self.name, self._routes,
                       self._router, self._links)


def _close(a: tuple[float, float], b: tuple[float, float]) -> bool:
    return all(abs(x - y) <= 1e-12 * max(abs(x), abs(y), 1e-30) for x, y in zip(a, b, strict=False))


def _pair_cost(net: Network, src: int, dst: int) -> tuple[float, float]:
    alpha = beta = 0.0
    for u, v in net.route(src, dst):
        e = net.graph.edges[u, v]
        alpha += e["latency_us"] * 1e-6
        beta += 1.0 / (e["bandwidth_gbps"] * 1e9)
    return alpha, beta


# --------------------------------------------------------------------------- building
def _add_link(g: nx.Graph, a: str, b: str, latency_us: float, bandwidth_gbps: float) -> None:
    g.add_edge(a, b, latency_us=float(latency_us), bandwidth_gbps=float(bandwidth_gbps))


def _place(g: nx.Graph, node: str, kind: str, ranks: list[int], rank_node: dict[int, str]) -> None:
    g.add_node(node, kind=kind)
    if len(ranks) == 1:
        rank_node[ranks[0]] = node
        g.nodes[node]["ranks"] = list(ranks)
        return
    lat, bw = INTRA_NODE.get(kind, INTRA_NODE["host"])
    for r in ranks:
        port = f"rank{r}"
        g.add_node(port, kind="rank")
        _add_link(g, port, node, lat, bw)
        rank_node[r] = port


def preset_network(name: str, world_size: int) -> Network:
    """Build a preset: loopback, switch8, two_nodes, ring."""
    p = world_size
    g = nx.Graph()
    rank_node: dict[int, str] = {}
    if name == "loopback":
        # One host, one process per rank, every rank with its own port into the host.
        g.add_node("host", kind="host")
        lat, bw = INTRA_NODE["host"]
        for r in range(p):
            g.add_node(f"rank{r}", kind="rank")
            _add_link(g, f"rank{r}", "host", lat, bw)
            rank_node[r] = f"rank{r}"
        gamma = GAMMA_CPU
    elif name == "switch8":
        if p > PRESET_MAX_WORLD[name]:
            raise ScenarioError(f"topology.preset: switch8 has 8 GPUs, world_size {p} does not fit")
        g.add_node("switch", kind="switch")
        for r in range(p):
            _place(g, f"gpu{r}", "gpu", [r], rank_node)
            _add_link(g, f"gpu{r}", "switch", 1.0, 300.0)
        gamma = GAMMA_GPU
    elif name == "two_nodes":
        # Two hosts, GPUs on a local switch, one NIC each, NICs joined by one link.
        half = (p + 1) // 2
        for h in range(2):
            g.add_node(f"node{h}.switch", kind="switch")
            g.add_node(f"node{h}.nic", kind="nic")
            _add_link(g, f"node{h}.switch", f"node{h}.nic", 1.0, 64.0)
        _add_link(g, "node0.nic", "node1.nic", 5.0, 25.0)
        for r in range(p):
            h = 0 if r < half else 1
            _place(g, f"node{h}.gpu{r}", "gpu", [r], rank_node)
            _add_link(g, f"node{h}.gpu{r}", f"node{h}.switch", 1.0, 300.0)
        gamma = GAMMA_GPU
    elif name == "ring":
        for r in range(p):
            _place(g, f"gpu{r}", "gpu", [r], rank_node)
        if p == 2:
            _add_link(g, "gpu0", "gpu1", 2.0, 50.0)
        elif p > 2:
            for r in range(p):
                _add_link(g, f"gpu{r}", f"gpu{(r + 1) % p}", 2.0, 50.0)
        gamma = GAMMA_GPU
    else:
        raise ScenarioError(f"topology.preset: unknown preset '{name}' (choose from {', '.join(PRESETS)})")
    net = Network(g, p, rank_node, gamma, name=name)
    _check_connected(net)
    return net


def uniform_network(world_size: int, alpha: float, beta: float, gamma: float) -> Network:
    """Every rank with its own port into a non-blocking hub; any pair costs alpha + n*beta
    (two hops of alpha/2 and 2/beta bytes/s each). Used for calibrated parameters."""
    g = nx.Graph()
    g.add_node("hub", kind="switch")
    rank_node = {}
    bw = (2.0 / beta) / 1e9 if beta > 0 else 1e12
    for r in range(world_size):
        g.add_node(f"rank{r}", kind="rank")
        _add_link(g, f"rank{r}", "hub", alpha / 2 * 1e6, bw)
        rank_node[r] = f"rank{r}"
    return Network(g, world_size, rank_node, gamma, name="uniform")


def scenario_network(topo, world_size: int) -> Network:
    """Network from a `simdist.scenario.Topology` (preset or nodes/links)."""
    if topo.preset is not None:
        net = preset_network(topo.preset, world_size)
    else:
        g = nx.Graph()
        rank_node: dict[int, str] = {}
        kinds = set()
        for i, n in enumerate(topo.nodes):
            if n.name in g:
                raise ScenarioError(f"topology.nodes[{i}].name: duplicate node '{n.name}'")
            kinds.add(n.kind)
            if n.ranks:
                _place(g, n.name, n.kind, list(n.ranks), rank_node)
            else:
                g.add_node(n.name, kind=n.kind)
        for i, link in enumerate(topo.links):
            for end in ("a", "b"):
                if getattr(link, end) not in g:
                    raise ScenarioError(f"topology.links[{i}].{end}: unknown node '{getattr(link, end)}'")
            if link.a == link.b:
                raise ScenarioError(f"topology.links[{i}]: a link joins two different nodes")
            _add_link(g, link.a, link.b, link.latency_us, link.bandwidth_gbps)
        missing = sorted(set(range(world_size)) - set(rank_node))
        if missing:
            raise ScenarioError(f"topology.nodes: ranks {missing} are not placed on any node")
        gamma = GAMMA_GPU if kinds and kinds <= {"gpu", "switch", "nic"} else GAMMA_CPU
        net = Network(g, world_size, rank_node, gamma, name="custom")
        _check_connected(net)
    if topo.gamma is not None:
        net.gamma = float(topo.gamma)
    return net


def _check_connected(net: Network) -> None:
    nodes = {net.rank_node[r] for r in range(net.world_size)}
    if len(nodes) <= 1:
        return
    comp = nx.node_connected_component(net.graph, net.rank_node[0])
    lost = sorted(r for r in range(net.world_size) if net.rank_node[r] not in comp)
    if lost:
        raise ScenarioError(f"topology.links: ranks {lost} cannot reach rank 0 (the topology is disconnected)")


@lru_cache(maxsize=64)
def cached_preset(name: str, world_size: int) -> Network:
    return preset_network(name, world_size)
