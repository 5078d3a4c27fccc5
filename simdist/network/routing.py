"""Routing: shortest paths between ranks, and the numbered directed links they use.

Routes are shortest by latency (ties: fewer hops, then name order). Every preset but
ring is a tree, where the route is the tree path: `Router` climbs to the common
ancestor, and `LinkIndex.routes` does that for many pairs at once from a table of
ancestors. Other graphs get one Dijkstra per source node.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass
from typing import Any

import networkx as nx
import numpy as np

from simdist.errors import ScenarioError

FEW_PAIRS = 64  # up to this many pairs, routes and costs are looked up pair by pair (cached): cheaper than arrays


@dataclass(frozen=True)
class TreeTables:
    """A tree as arrays: node i's parent, depth, and its ancestor at every depth."""

    nodes: list[str]
    parents: list[str | None]
    index: dict[str, int]
    depth: np.ndarray
    ancestor: np.ndarray  # (nodes, max depth + 1): the ancestor at depth k, -1 below the node

    @classmethod
    def of(cls, parent: dict[str, str | None], depth: dict[str, int]) -> TreeTables:
        nodes = list(parent)
        index = {n: i for i, n in enumerate(nodes)}
        dep = np.array([depth[n] for n in nodes], dtype=np.int64)
        anc = np.full((len(nodes), int(dep.max(initial=0)) + 1), -1, dtype=np.int64)
        for i, n in enumerate(nodes):
            node: str | None = n
            while node is not None:
                anc[i, depth[node]] = index[node]
                node = parent[node]
        return cls(nodes, [parent[n] for n in nodes], index, dep, anc)

    def hops(self, a: np.ndarray, b: np.ndarray, up: np.ndarray, down: np.ndarray) -> np.ndarray:
        """Link numbers of the paths from nodes a[j] to b[j]: up from a to the common
        ancestor, then down to b (-1 past a path's end)."""
        da, db = self.depth[a], self.depth[b]
        width = self.ancestor.shape[1]
        shared = (self.ancestor[a] == self.ancestor[b]) & (self.ancestor[a] >= 0)
        lca = shared.sum(axis=1) - 1  # ancestors agree down to the common one, then differ
        n_up, n_down = da - lca, db - lca
        hops = np.full((int((n_up + n_down).max(initial=0)), len(a)), -1, dtype=np.int64)
        for h in range(hops.shape[0]):
            going_up = h < n_up
            k_up = np.minimum(np.maximum(da - h, 0), width - 1)  # the node left at hop h, going up
            k_down = np.minimum(np.maximum(lca + 1 + h - n_up, 0), width - 1)  # the node reached at hop h, going down
            link = np.where(going_up, up[self.ancestor[a, k_up]], down[self.ancestor[b, k_down]])
            hops[h] = np.where(going_up | (h < n_up + n_down), link, -1)
        return hops


class LinkIndex:
    """The directed links of a network, numbered as routes first use them, with the
    per-link numbers the link model needs as lists indexed by that number (the step-level
    simulation keeps per-link state in arrays)."""

    def __init__(self, net: Any):  # a topology.Network (which imports this module)
        self.net = net
        self.ids: dict[tuple[str, str], int] = {}
        self.names: list[str] = []
        self.latency_s: list[float] = []
        self.bandwidth_Bps: list[float] = []
        self._route_ids: dict[tuple[int, int], tuple[int, ...]] = {}
        self._tree: tuple[np.ndarray, np.ndarray] | None = None
        self._rank_node: np.ndarray | None = None

    def __len__(self) -> int:
        return len(self.names)

    def route(self, src: int, dst: int) -> tuple[int, ...]:
        """The link numbers of the route from rank src to rank dst."""
        r = self._route_ids.get((src, dst))
        if r is None:
            r = self._route_ids[(src, dst)] = tuple(self._id(u, v) for u, v in self.net.route(src, dst))
        return r

    def routes(self, src: np.ndarray, dst: np.ndarray) -> np.ndarray:
        """The routes of many rank pairs at once: link numbers, hop by hop (max hops x
        pairs), -1 past a route's end. On a tree, from the ancestors of both ends, without
        a step per pair: an all-to-all on 1,024 ranks asks for a million routes."""
        tree = self.net.router.tree
        if tree is None or len(src) <= FEW_PAIRS:
            lists = [self.route(a, b) for a, b in zip(np.asarray(src).tolist(), np.asarray(dst).tolist(), strict=True)]
            hops = np.full((max((len(r) for r in lists), default=0), len(lists)), -1, dtype=np.int64)
            for j, r in enumerate(lists):
                hops[: len(r), j] = r
            return hops
        up, down = self._tree_links(tree)
        rank_node = self._rank_nodes(tree)
        return tree.hops(rank_node[src], rank_node[dst], up, down)

    def _tree_links(self, tree: TreeTables) -> tuple[np.ndarray, np.ndarray]:
        """Per tree node: the number of its link to its parent, and of the parent's to it."""
        if self._tree is None:
            up = np.full(len(tree.nodes), -1, dtype=np.int64)
            down = np.full(len(tree.nodes), -1, dtype=np.int64)
            for i, (node, parent) in enumerate(zip(tree.nodes, tree.parents, strict=True)):
                if parent is not None:
                    up[i], down[i] = self._id(node, parent), self._id(parent, node)
            self._tree = (up, down)
        return self._tree

    def _rank_nodes(self, tree: TreeTables) -> np.ndarray:
        if self._rank_node is None:
            rank_node = self.net.rank_node
            self._rank_node = np.array([tree.index[rank_node[r]] for r in range(len(rank_node))], dtype=np.int64)
        return self._rank_node

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
        self.tree: TreeTables | None = None
        if g.number_of_nodes() and nx.is_tree(g):
            root = min(g.nodes)
            self._parent[root], self._depth[root] = None, 0
            for u, v in nx.bfs_edges(g, root):
                self._parent[v], self._depth[v] = u, self._depth[u] + 1
            self.tree = TreeTables.of(self._parent, self._depth)

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
