"""The wait-for graph written out: DOT (always available) and pictures (PNG, SVG, PDF).

Both say the same thing: one node per rank (its status and the operation it is blocked
in), one edge per "r waits for m" with the operation, its per-group sequence number, the
group and why (``missing``: m never issued it; ``mismatch``: m issued a different
collective there; ``p2p``: m never posted the matching send/recv). Colours tell a
deadlock core (ranks waiting on each other) from a root (a rank waiting on ranks that are
not blocked) and from the culprits those wait on. DOT goes through networkx's pydot
bridge, so any Graphviz tool can lay it out; pictures are drawn with matplotlib, with a
legend, curved edges whose labels stay apart when two ranks wait on each other, and
margins so that no node or label is clipped.
"""

from __future__ import annotations

from pathlib import Path

import networkx as nx

from simdist.check.waitfor import WaitFor
from simdist.errors import InputError

DOT_SUFFIXES = (".dot", ".gv")
PICTURE_SUFFIXES = (".png", ".svg", ".pdf")
GRAPH_SUFFIXES = DOT_SUFFIXES + PICTURE_SUFFIXES
NODE_SIZE = 2400  # points^2: "completed" fits inside

# role -> (fill colour, legend text)
ROLES = {
    "core": ("#e74c3c", "deadlock core: blocked, waiting on each other"),
    "root": ("#f0a04b", "blocked, waiting on ranks that are not blocked"),
    "downstream": ("#f5b7b1", "blocked only because the ranks above are"),
    "culprit": ("#f7dc6f", "not blocked, but waited on (finished or exited)"),
    "other": ("#abebc6", "not involved"),
}
# reason -> (matplotlib line style, DOT style, colour, legend text)
REASONS = {
    "missing": ("solid", "solid", "#34495e", "missing: never issued that operation"),
    "mismatch": ("dashed", "dashed", "#c0392b", "mismatch: issued a different collective there"),
    "p2p": ("dotted", "dotted", "#2e86c1", "p2p: never posted the matching send/recv"),
}


def check_graph_path(path: Path) -> None:
    """The suffix says the format; anything else is bad usage (checked before any work)."""
    if path.suffix.lower() not in GRAPH_SUFFIXES:
        raise InputError(f"graph: cannot tell the format of {path.name} (use one of {', '.join(GRAPH_SUFFIXES)})")


def role(wf: WaitFor, rank: int) -> str:
    if any(rank in c for c in wf.core):
        return "core"
    if rank in wf.roots:
        return "root"
    if rank in wf.blocked:
        return "downstream"
    if rank in wf.culprits:
        return "culprit"
    return "other"


def node_label(wf: WaitFor, rank: int, sep: str = "\n") -> str:
    d = wf.graph.nodes[rank]
    e = d.get("entry")
    parts = [f"rank {rank}", d["status"]]
    if e is not None:
        parts.append(f"in {e.op} #{e.seq} ({e.group})")
    return sep.join(parts)


def edge_label(d: dict, sep: str = "\n") -> str:
    return f"{d['op']} #{d['seq']} on {d['group']}{sep}({d['reason']})"


def to_dot(wf: WaitFor, title: str = "wait-for graph") -> str:
    """The graph in Graphviz's DOT language, with machine-readable attributes beside the labels."""
    d = nx.DiGraph()
    d.graph["graph"] = {"label": title, "labelloc": "t", "rankdir": "LR"}
    d.graph["node"] = {"shape": "box", "style": "rounded,filled"}
    for n, data in sorted(wf.graph.nodes(data=True)):
        r = role(wf, n)
        d.add_node(n, label=node_label(wf, n, "\\n"), fillcolor=ROLES[r][0], role=r, status=data["status"])
    for a, b, data in sorted(wf.graph.edges(data=True), key=lambda x: (x[0], x[1])):
        _, style, colour, _ = REASONS[data["reason"]]
        d.add_edge(a, b, label=edge_label(data, "\\n"), style=style, color=colour, fontcolor=colour,
                   reason=data["reason"], op=data["op"], seq=data["seq"], group=data["group"])
    return nx.nx_pydot.to_pydot(d).to_string()


def write_graph(wf: WaitFor, path: str | Path, title: str = "wait-for graph") -> Path:
    """DOT for .dot/.gv, a picture for .png/.svg/.pdf (`check_graph_path` names the rest)."""
    p = Path(path)
    check_graph_path(p)
    if p.suffix.lower() in DOT_SUFFIXES:
        p.write_text(to_dot(wf, title))
        return p
    return draw_waitfor(wf, p, title)


def draw_waitfor(wf: WaitFor, path: str | Path, title: str = "wait-for graph") -> Path:
    """Save the picture (format by suffix); the figure's bounding box takes in every artist."""
    import matplotlib.pyplot as plt

    fig = waitfor_figure(wf, title)
    p = Path(path)
    fig.savefig(p, bbox_inches="tight", pad_inches=0.3)
    plt.close(fig)
    return p


def waitfor_figure(wf: WaitFor, title: str = "wait-for graph"):
    """The matplotlib Figure: nodes coloured by role, labelled edges, a legend. Texts and nodes
    are not clipped to the axes, so a tight bounding box keeps all of them (tests inspect it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt
    from matplotlib.lines import Line2D
    from matplotlib.patches import Patch

    g = wf.graph
    pos = nx.circular_layout(g) if len(g) > 1 else {r: (0.0, 0.0) for r in g}
    xs, ys = [x for x, _ in pos.values()] or [0.0], [y for _, y in pos.values()] or [0.0]
    pad = 0.7  # layout units: room for a node, its caption and curved edges' labels at the border
    width, height = max(xs) - min(xs) + 2 * pad, max(ys) - min(ys) + 2 * pad
    fig, ax = plt.subplots(figsize=(2.6 * width, 2.6 * height))
    ax.set_xlim(min(xs) - pad, max(xs) + pad)
    ax.set_ylim(min(ys) - pad, max(ys) + pad)
    ax.set_aspect("equal")
    nodes = sorted(g.nodes)
    drawn = nx.draw_networkx_nodes(g, pos, nodelist=nodes, ax=ax, node_size=NODE_SIZE, edgecolors="#555555",
                                   node_color=[ROLES[role(wf, r)][0] for r in nodes])
    drawn.set_clip_on(False)
    inside = {r: f"rank {r}\n{g.nodes[r]['status']}" for r in nodes}
    texts = list(nx.draw_networkx_labels(g, pos, inside, ax=ax, font_size=8).values())
    for r in nodes:  # what a blocked rank is in: outside its node, away from the centre where edges run
        e = g.nodes[r].get("entry")
        if e is not None:
            texts.append(_caption(ax, pos[r], f"in {e.op} #{e.seq}\n({e.group})"))
    for t in texts:
        t.set_clip_on(False)
    curve = "arc3,rad=0.25"  # opposite edges bend to opposite sides, and so do their labels
    for reason, (ls, _, colour, _) in REASONS.items():
        edges = [(a, b) for a, b, d in g.edges(data=True) if d["reason"] == reason]
        if not edges:
            continue
        nx.draw_networkx_edges(g, pos, edgelist=edges, ax=ax, style=ls, edge_color=colour, arrows=True,
                               arrowsize=16, node_size=NODE_SIZE, connectionstyle=curve)
        texts = nx.draw_networkx_edge_labels(
            g, pos, edge_labels={(a, b): edge_label(g.edges[a, b]) for a, b in edges}, ax=ax, font_size=7,
            font_color=colour, connectionstyle=curve, label_pos=0.5,
            bbox={"boxstyle": "round,pad=0.2", "fc": "white", "ec": colour, "alpha": 0.9})
        for t in texts.values():
            t.set_clip_on(False)
    present_roles = [k for k in ROLES if any(role(wf, r) == k for r in nodes)]
    present_reasons = [k for k in REASONS if any(d["reason"] == k for _, _, d in g.edges(data=True))]
    handles = [Patch(facecolor=ROLES[k][0], edgecolor="#555555", label=ROLES[k][1]) for k in present_roles]
    handles += [Line2D([0], [0], color=REASONS[k][2], linestyle=REASONS[k][0], label=REASONS[k][3])
                for k in present_reasons]
    ax.legend(handles=handles, loc="upper center", bbox_to_anchor=(0.5, -0.02), fontsize=8, frameon=False,
              ncol=1, title="edge r → m: rank r waits for rank m", title_fontsize=8)
    ax.set_title(title)
    ax.axis("off")
    return fig


def _caption(ax, xy, text: str):
    """Text beside a node on the side facing away from the layout's centre."""
    x, y = float(xy[0]), float(xy[1])
    norm = (x * x + y * y) ** 0.5
    dx, dy = (x / norm, y / norm) if norm > 1e-9 else (0.0, -1.0)
    ha = "left" if dx > 0.3 else "right" if dx < -0.3 else "center"
    va = "bottom" if dy > 0.3 else "top" if dy < -0.3 else "center"
    return ax.text(x + 0.2 * dx, y + 0.2 * dy, text, ha=ha, va=va, fontsize=7)
