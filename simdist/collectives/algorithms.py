"""Collective algorithms: schedule generators, closed-form costs and byte counts.

Every algorithm is registered as ``(op, algo) -> Algorithm`` with
  * ``schedule(p, count, root)``: the step-level `Schedule` (any p >= 1);
  * ``coeffs(p)``: (ca, kb, kg) so that the closed-form time is
    ``T = ca*alpha + n*(kb*beta + kg*gamma)`` (n = per-rank bytes as defined in
    `simdist.network.cost`); closed forms are cached per p by the cost model;
  * ``units(p, count)``: the units the schedule puts on the wire, summed over messages.

The closed forms are the textbook ones (Thakur, Rabenseifner & Gropp 2005; Chan et al.
2007) for powers of two, extended exactly to any p by MPICH's folding (2r ranks pair up
before and after a power-of-two core) or by summing per-step maxima. They equal the
no-contention step-level execution when n divides evenly into the blocks (tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from simdist.collectives.schedule import (
    Fold,
    Schedule,
    Transfer,
    ceil_log2,
    pow2_floor,
    same,
    span,
    split,
)

OPS = (
    "all_reduce",
    "broadcast",
    "reduce",
    "all_gather",
    "reduce_scatter",
    "all_to_all",
    "gather",
    "scatter",
    "barrier",
)

Coeffs = tuple[float, float, float]


@dataclass(frozen=True)
class Algorithm:
    op: str
    name: str
    schedule: Callable[[int, int, int], Schedule]
    coeffs: Callable[[int], Coeffs]
    units: Callable[[int, int], int]
    formula: str  # closed form in alpha/beta/gamma, p, n, for power-of-two p
    description: str
    min_p: int = 1

    def time(self, p: int, nbytes: float, alpha: float, beta: float, gamma: float) -> float:
        ca, kb, kg = self.coeffs(p)
        return ca * alpha + nbytes * (kb * beta + kg * gamma)


def _lg(p: int) -> int:
    return ceil_log2(p)


def _popcount_sum(p: int) -> int:
    return sum(bin(j).count("1") for j in range(p))


def _min_sum(p: int) -> int:
    """Sum over binomial distances d < p of min(d, p - d) (blocks per binomial step)."""
    s, d = 0, 1
    while d < p:
        s += min(d, p - d)
        d *= 2
    return s


def _fold_sum(p: int) -> int:
    """Sum over recursive-halving/doubling distances of the heaviest group's blocks."""
    p2 = pow2_floor(p)
    r = p - p2
    s, d = 0, 1
    while d < p2:
        s += d + min(r, d)
        d *= 2
    return s


# =========================================================================== all_reduce
def _ar_ring(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_reduce", "ring", p, count, count, root)
    blocks = split(count, p)
    for k in range(p - 1):
        s.add([Transfer(i, (i + 1) % p, same(blocks[(i - k) % p]), True) for i in range(p)], "reduce-scatter")
    for k in range(p - 1):
        s.add([Transfer(i, (i + 1) % p, same(blocks[(i + 1 - k) % p])) for i in range(p)], "all-gather")
    return s


def _binomial_reduce_steps(s: Schedule, p: int, count: int, root: int, phase: str = "reduce") -> None:
    d = 1
    while d < p:
        ts = []
        for vr in range(p):
            if vr % (2 * d) == d:
                ts.append(Transfer((vr + root) % p, (vr - d + root) % p, ((0, 0, count),), True))
        s.add(ts, phase)
        d *= 2


def _binomial_bcast_steps(s: Schedule, p: int, count: int, root: int, phase: str = "broadcast") -> None:
    d = 1
    while d < p:
        ts = []
        for vr in range(min(d, p - d)):
            ts.append(Transfer((vr + root) % p, (vr + d + root) % p, ((0, 0, count),)))
        s.add(ts, phase)
        d *= 2


def _ar_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_reduce", "tree", p, count, count, root)
    _binomial_reduce_steps(s, p, count, 0)
    _binomial_bcast_steps(s, p, count, 0)
    return s


def _fold_pre(s: Schedule, f: Fold, count: int, reduce: bool) -> None:
    s.add([Transfer(e, o, ((0, 0, count),), reduce) for e, o in f.extras()], "fold in")


def _fold_post(s: Schedule, f: Fold, count: int) -> None:
    s.add([Transfer(o, e, ((0, 0, count),)) for e, o in f.extras()], "fold out")


def _ar_rd(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_reduce", "recursive_doubling", p, count, count, root)
    f = Fold(p)
    _fold_pre(s, f, count, True)
    d = 1
    while d < f.p2:
        s.add([Transfer(f.real(v), f.real(v ^ d), ((0, 0, count),), True) for v in range(f.p2)], "exchange")
        d *= 2
    _fold_post(s, f, count)
    return s


def _halving_steps(s: Schedule, f: Fold, blocks_of: Callable[[int, int], tuple[int, int]]) -> None:
    """Recursive halving among virtual ranks; blocks_of(v_lo, v_hi) -> (off, len)."""
    d = f.p2 // 2
    while d >= 1:
        ts = []
        for v in range(f.p2):
            partner = v ^ d
            g = v & ~(2 * d - 1)
            lo, hi = (g + d, g + 2 * d) if v < partner else (g, g + d)
            ts.append(Transfer(f.real(v), f.real(partner), same(blocks_of(lo, hi)), True))
        s.add(ts, "reduce-scatter (halving)")
        d //= 2


def _doubling_steps(s: Schedule, f: Fold, blocks_of: Callable[[int, int], tuple[int, int]]) -> None:
    d = 1
    while d < f.p2:
        ts = []
        for v in range(f.p2):
            g = v & ~(d - 1)
            ts.append(Transfer(f.real(v), f.real(v ^ d), same(blocks_of(g, g + d))))
        s.add(ts, "all-gather (doubling)")
        d *= 2


def _ar_rabenseifner(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_reduce", "rabenseifner", p, count, count, root)
    f = Fold(p)
    blocks = split(count, f.p2)
    _fold_pre(s, f, count, True)
    _halving_steps(s, f, lambda lo, hi: span(blocks, lo, hi))
    _doubling_steps(s, f, lambda lo, hi: span(blocks, lo, hi))
    _fold_post(s, f, count)
    return s


def _ar_rd_coeffs(p: int) -> Coeffs:
    p2 = pow2_floor(p)
    l2 = p2.bit_length() - 1
    if p == p2:
        return (l2, l2, l2)
    return (l2 + 2, l2 + 2, l2 + 1)


def _ar_rab_coeffs(p: int) -> Coeffs:
    p2 = pow2_floor(p)
    l2 = p2.bit_length() - 1
    ca, kb, kg = 2 * l2, 2 * (p2 - 1) / p2, (p2 - 1) / p2
    if p != p2:
        ca, kb, kg = ca + 2, kb + 2, kg + 1
    return (ca, kb, kg)


# =========================================================================== broadcast / reduce
def _bc_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("broadcast", "tree", p, count, count, root)
    _binomial_bcast_steps(s, p, count, root)
    return s


def _binomial_scatter_steps(s: Schedule, p: int, blocks: list[tuple[int, int]], root: int, phase: str) -> None:
    """Binomial scatter of relative blocks (block j goes to relative rank j)."""
    d = pow2_floor(p - 1) if p > 1 else 0
    while d >= 1:
        ts = []
        for vr in range(0, p, 2 * d):
            if vr + d < p:
                piece = span(blocks, vr + d, min(vr + 2 * d, p))
                ts.append(Transfer((vr + root) % p, (vr + d + root) % p, same(piece)))
        s.add(ts, phase)
        d //= 2


def _bc_scatter_allgather(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("broadcast", "scatter_allgather", p, count, count, root)
    blocks = split(count, p)  # block j belongs to relative rank j
    _binomial_scatter_steps(s, p, blocks, root, "scatter")
    for k in range(p - 1):
        s.add(
            [Transfer((vr + root) % p, (vr + 1 + root) % p, same(blocks[(vr - k) % p])) for vr in range(p)],
            "ring all-gather",
        )
    return s


def _bc_direct(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("broadcast", "direct", p, count, count, root)
    for k in range(1, p):
        s.add([Transfer(root, (root + k) % p, ((0, 0, count),))], "send")
    return s


def _rd_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce", "tree", p, count, count, root)
    _binomial_reduce_steps(s, p, count, root)
    return s


def _rd_direct(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce", "direct", p, count, count, root)
    for k in range(1, p):
        s.add([Transfer((root + k) % p, root, ((0, 0, count),), True)], "receive")
    return s


# =========================================================================== all_gather
def _ag_ring(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_gather", "ring", p, count, p * count, root)
    blocks = [(i * count, count) for i in range(p)]
    for k in range(p - 1):
        s.add([Transfer(i, (i + 1) % p, same(blocks[(i - k) % p])) for i in range(p)], "ring")
    return s


def _ag_rd(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_gather", "recursive_doubling", p, count, p * count, root)
    f = Fold(p)
    blocks = [(i * count, count) for i in range(p)]
    s.add([Transfer(e, o, same(blocks[e])) for e, o in f.extras()], "fold in")

    def blocks_of(v_lo: int, v_hi: int) -> tuple[int, int]:
        lo, hi = f.block_range(v_lo, v_hi)
        return span(blocks, lo, hi)

    _doubling_steps(s, f, blocks_of)
    post = []
    for e, o in f.extras():
        pieces = tuple(pc for pc in (same(span(blocks, 0, e))[0], same(span(blocks, e + 1, p))[0]) if pc[2] > 0)
        post.append(Transfer(o, e, pieces))
    s.add(post, "fold out")
    return s


def _ag_pairwise(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_gather", "pairwise", p, count, p * count, root)
    for k in range(1, p):
        s.add([Transfer(i, (i + k) % p, ((i * count, i * count, count),)) for i in range(p)], "exchange")
    return s


def _ag_rd_coeffs(p: int) -> Coeffs:
    p2 = pow2_floor(p)
    l2 = p2.bit_length() - 1
    if p == p2:
        return (l2, p - 1, 0.0)
    return (l2 + 2, 1 + _fold_sum(p) + (p - 1), 0.0)


# =========================================================================== reduce_scatter
def _rs_ring(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce_scatter", "ring", p, count, count, root)
    blocks = split(count, p)
    for k in range(p - 1):
        s.add([Transfer(i, (i + 1) % p, same(blocks[(i - k - 1) % p]), True) for i in range(p)], "ring")
    return s


def _rs_halving(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce_scatter", "recursive_halving", p, count, count, root)
    f = Fold(p)
    blocks = split(count, p)
    _fold_pre(s, f, count, True)

    def blocks_of(v_lo: int, v_hi: int) -> tuple[int, int]:
        lo, hi = f.block_range(v_lo, v_hi)
        return span(blocks, lo, hi)

    _halving_steps(s, f, blocks_of)
    s.add([Transfer(o, e, same(blocks[e])) for e, o in f.extras()], "fold out")
    return s


def _rs_pairwise(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce_scatter", "pairwise", p, count, count, root)
    blocks = split(count, p)
    for k in range(1, p):
        s.add([Transfer(i, (i + k) % p, same(blocks[(i + k) % p]), True) for i in range(p)], "exchange")
    return s


def _rs_halving_coeffs(p: int) -> Coeffs:
    p2 = pow2_floor(p)
    l2 = p2.bit_length() - 1
    if p == p2:
        return (l2, (p - 1) / p, (p - 1) / p)
    fs = _fold_sum(p)
    return (l2 + 2, 1 + fs / p + 1 / p, 1 + fs / p)


# =========================================================================== all_to_all
def _a2a_pairwise(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_to_all", "pairwise", p, count, 2 * count, root)
    q = count // p
    for k in range(1, p):
        ts = []
        for i in range(p):
            j = (i + k) % p
            ts.append(Transfer(i, j, ((j * q, count + i * q, q),)))
        s.add(ts, "exchange")
    return s


# =========================================================================== gather / scatter
def _gather_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("gather", "tree", p, count, p * count, root)
    d = 1
    while d < p:
        ts = []
        for vr in range(p):
            if vr % (2 * d) == d:
                pieces = []
                for j in range(vr, min(vr + d, p)):  # relative ranks whose blocks vr carries
                    a = (j + root) % p
                    pieces.append((a * count, a * count, count))
                ts.append(Transfer((vr + root) % p, (vr - d + root) % p, tuple(_merge(pieces))))
        s.add(ts, "gather")
        d *= 2
    return s


def _merge(pieces: list[tuple[int, int, int]]) -> list[tuple[int, int, int]]:
    """Merge adjacent same-offset pieces into one."""
    out: list[tuple[int, int, int]] = []
    for so, do, n in sorted(pieces):
        if out and out[-1][0] + out[-1][2] == so and out[-1][1] + out[-1][2] == do:
            a, b, m = out[-1]
            out[-1] = (a, b, m + n)
        else:
            out.append((so, do, n))
    return out


def _gather_direct(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("gather", "direct", p, count, p * count, root)
    for k in range(1, p):
        a = (root + k) % p
        s.add([Transfer(a, root, ((a * count, a * count, count),))], "receive")
    return s


def _scatter_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("scatter", "tree", p, count, count, root)
    blocks = split(count, p)
    d = pow2_floor(p - 1) if p > 1 else 0
    while d >= 1:
        ts = []
        for vr in range(0, p, 2 * d):
            if vr + d < p:
                pieces = []
                for j in range(vr + d, min(vr + 2 * d, p)):
                    a = (j + root) % p
                    pieces.append(same(blocks[a])[0])
                ts.append(Transfer((vr + root) % p, (vr + d + root) % p, tuple(_merge(pieces))))
        s.add(ts, "scatter")
        d //= 2
    return s


def _scatter_direct(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("scatter", "direct", p, count, count, root)
    blocks = split(count, p)
    for k in range(1, p):
        a = (root + k) % p
        s.add([Transfer(root, a, same(blocks[a]))], "send")
    return s


# =========================================================================== barrier
def _barrier_dissemination(p: int, count: int = 0, root: int = 0) -> Schedule:
    s = Schedule("barrier", "dissemination", p, 0, 0, root)
    d = 1
    while d < p:
        s.add([Transfer(i, (i + d) % p, ()) for i in range(p)], "signal")
        d *= 2
    return s


def _barrier_tree(p: int, count: int = 0, root: int = 0) -> Schedule:
    s = Schedule("barrier", "tree", p, 0, 0, root)
    d = 1
    while d < p:
        s.add([Transfer(vr, vr - d, ()) for vr in range(p) if vr % (2 * d) == d], "gather")
        d *= 2
    d = 1
    while d < p:
        s.add([Transfer(vr, vr + d, ()) for vr in range(min(d, p - d))], "release")
        d *= 2
    return s


# =========================================================================== registry
def _A(op, name, sched, coeffs, units, formula, desc) -> Algorithm:
    return Algorithm(op, name, sched, coeffs, units, formula, desc)


_ALGOS: list[Algorithm] = [
    _A(
        "all_reduce",
        "ring",
        _ar_ring,
        lambda p: (2 * (p - 1), 2 * (p - 1) / p, (p - 1) / p),
        lambda p, c: 2 * (p - 1) * c,
        "2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ",
        "reduce-scatter then all-gather around a ring (Patarasuk & Yuan; NCCL ring, Gloo ring)",
    ),
    _A(
        "all_reduce",
        "tree",
        _ar_tree,
        lambda p: (2 * _lg(p), 2 * _lg(p), _lg(p)),
        lambda p, c: 2 * (p - 1) * c,
        "2⌈lg p⌉·α + 2⌈lg p⌉·n·β + ⌈lg p⌉·n·γ",
        "binomial-tree reduce to rank 0, then binomial-tree broadcast",
    ),
    _A(
        "all_reduce",
        "recursive_doubling",
        _ar_rd,
        _ar_rd_coeffs,
        lambda p, c: (pow2_floor(p) * (pow2_floor(p).bit_length() - 1) + 2 * (p - pow2_floor(p))) * c,
        "lg p·(α + n·β + n·γ)",
        "pairwise exchange of the whole buffer at distances 1, 2, 4, ... (folded for non powers of two)",
    ),
    _A(
        "all_reduce",
        "rabenseifner",
        _ar_rabenseifner,
        _ar_rab_coeffs,
        lambda p, c: (2 * (pow2_floor(p) - 1) + 2 * (p - pow2_floor(p))) * c,
        "2lg p·α + 2(p-1)/p·n·β + (p-1)/p·n·γ",
        "recursive-halving reduce-scatter then recursive-doubling all-gather (Rabenseifner)",
    ),
    _A(
        "broadcast",
        "tree",
        _bc_tree,
        lambda p: (_lg(p), _lg(p), 0.0),
        lambda p, c: (p - 1) * c,
        "⌈lg p⌉·(α + n·β)",
        "binomial tree from the root",
    ),
    _A(
        "broadcast",
        "scatter_allgather",
        _bc_scatter_allgather,
        lambda p: (_lg(p) + p - 1, (_min_sum(p) + p - 1) / p, 0.0),
        lambda p, c: (_popcount_sum(p) + p * (p - 1)) * c // p,
        "(lg p + p - 1)·α + 2(p-1)/p·n·β",
        "binomial scatter then ring all-gather (van de Geijn)",
    ),
    _A(
        "broadcast",
        "direct",
        _bc_direct,
        lambda p: (p - 1, p - 1, 0.0),
        lambda p, c: (p - 1) * c,
        "(p-1)·(α + n·β)",
        "the root sends the whole buffer to each rank in turn",
    ),
    _A(
        "reduce",
        "tree",
        _rd_tree,
        lambda p: (_lg(p), _lg(p), _lg(p)),
        lambda p, c: (p - 1) * c,
        "⌈lg p⌉·(α + n·β + n·γ)",
        "binomial tree towards the root",
    ),
    _A(
        "reduce",
        "direct",
        _rd_direct,
        lambda p: (p - 1, p - 1, p - 1),
        lambda p, c: (p - 1) * c,
        "(p-1)·(α + n·β + n·γ)",
        "every rank sends to the root in turn",
    ),
    _A(
        "all_gather",
        "ring",
        _ag_ring,
        lambda p: (p - 1, p - 1, 0.0),
        lambda p, c: p * (p - 1) * c,
        "(p-1)·α + (p-1)/p·N·β   (N = p·n, n = per-rank contribution)",
        "each rank forwards the block it received last step to its successor",
    ),
    _A(
        "all_gather",
        "recursive_doubling",
        _ag_rd,
        _ag_rd_coeffs,
        lambda p, c: p * (p - 1) * c,
        "lg p·α + (p-1)/p·N·β   (N = p·n)",
        "exchange of doubling block groups at distances 1, 2, 4, ... (folded for non powers of two)",
    ),
    _A(
        "all_gather",
        "pairwise",
        _ag_pairwise,
        lambda p: (p - 1, p - 1, 0.0),
        lambda p, c: p * (p - 1) * c,
        "(p-1)·α + (p-1)/p·N·β   (N = p·n)",
        "at step k every rank sends its own block to rank + k",
    ),
    _A(
        "reduce_scatter",
        "ring",
        _rs_ring,
        lambda p: (p - 1, (p - 1) / p, (p - 1) / p),
        lambda p, c: (p - 1) * c,
        "(p-1)·α + (p-1)/p·n·(β + γ)",
        "partial sums travel around the ring, one block per step",
    ),
    _A(
        "reduce_scatter",
        "recursive_halving",
        _rs_halving,
        _rs_halving_coeffs,
        lambda p, c: (pow2_floor(p) - 1) * c + (p - pow2_floor(p)) * c + (p - pow2_floor(p)) * (c // p),
        "lg p·α + (p-1)/p·n·(β + γ)",
        "exchange of halving block ranges at distances p/2, p/4, ... (folded for non powers of two)",
    ),
    _A(
        "reduce_scatter",
        "pairwise",
        _rs_pairwise,
        lambda p: (p - 1, (p - 1) / p, (p - 1) / p),
        lambda p, c: (p - 1) * c,
        "(p-1)·α + (p-1)/p·n·(β + γ)",
        "at step k every rank sends block rank+k to rank + k",
    ),
    _A(
        "all_to_all",
        "pairwise",
        _a2a_pairwise,
        lambda p: (p - 1, (p - 1) / p, 0.0),
        lambda p, c: (p - 1) * (c // p) * p,
        "(p-1)·α + (p-1)/p·n·β",
        "at step k every rank sends the block for rank + k",
    ),
    _A(
        "gather",
        "tree",
        _gather_tree,
        lambda p: (_lg(p), _min_sum(p), 0.0),
        lambda p, c: _popcount_sum(p) * c,
        "lg p·α + (p-1)·n·β",
        "binomial tree towards the root, subtrees forwarding what they gathered",
    ),
    _A(
        "gather",
        "direct",
        _gather_direct,
        lambda p: (p - 1, p - 1, 0.0),
        lambda p, c: (p - 1) * c,
        "(p-1)·(α + n·β)",
        "every rank sends its block to the root in turn",
    ),
    _A(
        "scatter",
        "tree",
        _scatter_tree,
        lambda p: (_lg(p), _min_sum(p) / p, 0.0),
        lambda p, c: _popcount_sum(p) * c // p,
        "lg p·α + (p-1)/p·n·β",
        "binomial tree from the root, each child getting its subtree's blocks",
    ),
    _A(
        "scatter",
        "direct",
        _scatter_direct,
        lambda p: (p - 1, (p - 1) / p, 0.0),
        lambda p, c: (p - 1) * c // p,
        "(p-1)·α + (p-1)/p·n·β",
        "the root sends each rank its block in turn",
    ),
    _A(
        "barrier",
        "dissemination",
        _barrier_dissemination,
        lambda p: (_lg(p), 0.0, 0.0),
        lambda p, c: 0,
        "⌈lg p⌉·α",
        "at step k rank i signals rank i + 2^k (Hensgen, Finkel & Manber)",
    ),
    _A(
        "barrier",
        "tree",
        _barrier_tree,
        lambda p: (2 * _lg(p), 0.0, 0.0),
        lambda p, c: 0,
        "2⌈lg p⌉·α",
        "binomial gather of empty messages to rank 0, then binomial release",
    ),
]

REGISTRY: dict[tuple[str, str], Algorithm] = {(a.op, a.name): a for a in _ALGOS}

ALIASES: dict[str, str] = {
    "binomial": "tree",
    "binomial_tree": "tree",
    "rd": "recursive_doubling",
    "rh": "recursive_halving",
    "halving_doubling": "rabenseifner",
    "rs_ag": "rabenseifner",
    "direct": "direct",
    "van_de_geijn": "scatter_allgather",
    "linear": "direct",
}


def algorithms_for(op: str) -> list[str]:
    return [a.name for a in _ALGOS if a.op == op]


def resolve(op: str, algo: str | None, field: str = "algo") -> str | None:
    """Canonical algorithm name, or None for 'auto'. Raises ScenarioError naming `field`."""
    from simdist.errors import ScenarioError

    if op not in OPS:
        raise ScenarioError(f"{field}: unknown collective '{op}' (choose from {', '.join(OPS)})")
    if algo is None or algo == "auto":
        return None
    name = algo.strip().lower().replace("-", "_")
    name = ALIASES.get(name, name)
    if (op, name) not in REGISTRY:
        raise ScenarioError(
            f"{field}: unknown algorithm '{algo}' for {op} (choose from auto, {', '.join(algorithms_for(op))})"
        )
    return name


def get(op: str, algo: str) -> Algorithm:
    name = resolve(op, algo)
    assert name is not None
    return REGISTRY[(op, name)]


def make_schedule(op: str, algo: str, p: int, count: int, root: int = 0) -> Schedule:
    """The schedule of `algo` for `op` on p ranks with `count` units per rank."""
    from simdist.errors import ScenarioError

    a = get(op, algo)
    if p < a.min_p:
        raise ScenarioError(f"ranks: {op}/{a.name} needs at least {a.min_p} ranks, got {p}")
    if not 0 <= root < max(p, 1):
        raise ScenarioError(f"root: rank {root} out of range for {p} ranks")
    return a.schedule(p, count, root)
