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

from collections.abc import Iterator
from dataclasses import dataclass, field
from functools import lru_cache

import networkx as nx

from simdist.errors import ScenarioError

PRESETS = ("loopback", "switch8", "two_nodes", "ring")

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
                if self._router is None:
                    self._router = Router(self.graph)
                path = self._router.path(a, b)
                r = tuple(zip(path[:-1], path[1:], strict=False))
            self._routes[key] = r
        return r

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


class LinkIndex:
    """The directed links of a network, numbered as routes first use them, with the
    per-link numbers the link model needs as lists indexed by that number (the step-level
    simulation keeps per-link state in arrays)."""

    def __init__(self, net: Network):
        self.net = net
        self.ids: dict[tuple[str, str], int] = {}
        self.names: list[str] = []
        self.latency_s: list[float] = []
        self.bandwidth_Bps: list[float] = []
        self._route_ids: dict[tuple[int, int], tuple[int, ...]] = {}

    def __len__(self) -> int:
        return len(self.names)

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """The link numbers of the route from rank src to rank dst."""
        r = self._route_ids.get((src, dst))
        if r is None:
            r = self._route_ids[(src, dst)] = tuple(self._id(u, v) for u, v in self.net.route(src, dst))
        return r

    def _id(self, u: str, v: str) -> int:
        i = self.ids.get((u, v))
        if i is None:
            e = self.net.graph.edges[u, v]
            i = self.ids[(u, v)] = len(self.names)
            self.names.append(f"{u}->{v}")
            self.latency_s.append(e["latency_us"] * 1e-6)
            self.bandwidth_Bps.append(e["bandwidth_gbps"] * 1e9)
        return i


class Router:
    """Shortest paths by latency between graph nodes; ties: fewer hops, then name order.

    On a tree (every preset but ring) the only path is the tree path, found by climbing
    from both ends to their common ancestor: no search per pair, which matters when a
    1,024-rank ring asks for 1,024 routes. Elsewhere Dijkstra runs once per source node
    and every route from it comes from its predecessor lists (what
    `networkx.all_shortest_paths` does per call)."""

    def __init__(self, g: nx.Graph):
        self.g = g
        self._pred: dict[str, dict[str, list[str]]] = {}
        self._parent: dict[str, str | None] = {}
        self._depth: dict[str, int] = {}
        if g.number_of_nodes() and nx.is_tree(g):
            root = min(g.nodes)
            self._parent[root], self._depth[root] = None, 0
            for u, v in nx.bfs_edges(g, root):
                self._parent[v], self._depth[v] = u, self._depth[u] + 1

    def path(self, a: str, b: str) -> list[str]:
        return self._tree_path(a, b) if self._parent else self._shortest(a, b)

    def _tree_path(self, a: str, b: str) -> list[str]:
        up, down = [a], [b]
        while self._depth[up[-1]] > self._depth[down[-1]]:
            up.append(self._parent[up[-1]])  # type: ignore[arg-type]
        while self._depth[down[-1]] > self._depth[up[-1]]:
            down.append(self._parent[down[-1]])  # type: ignore[arg-type]
        while up[-1] != down[-1]:
            up.append(self._parent[up[-1]])  # type: ignore[arg-type]
            down.append(self._parent[down[-1]])  # type: ignore[arg-type]
        return up + down[-2::-1]

    def _shortest(self, a: str, b: str) -> list[str]:
        pred = self._pred.get(a)
        if pred is None:
            pred = self._pred[a] = nx.dijkstra_predecessor_and_distance(self.g, a, weight="latency_us")[0]
        if b not in pred:
            raise ScenarioError(f"topology.links: no path between {a} and {b} (the topology is disconnected)")
        return min(_paths_back(pred, a, b), key=lambda path: (len(path), path))


def _paths_back(pred: dict[str, list[str]], a: str, b: str) -> Iterator[list[str]]:
    """Every simple path a -> b along the predecessor lists of a shortest-path search from a."""
    stack = [[b]]
    while stack:
        path = stack.pop()
        if path[-1] == a:
            yield path[::-1]
            continue
        stack.extend(path + [u] for u in pred[path[-1]] if u not in path)


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
        if p > 8:
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
