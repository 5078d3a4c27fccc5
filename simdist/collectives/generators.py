"""Schedule generators: how each registered algorithm moves data, step by step.

Every algorithm is built from a few communication patterns, each defined once here:

* the **ring** (rank i sends to i + 1; ring all_reduce, reduce_scatter, all_gather and
  the all-gather half of van de Geijn's broadcast);
* **pairwise** exchange (at step k rank i sends to i + k);
* **direct** sends between the root and every other rank in turn;
* two **binomial trees** on ranks relative to the root: the *low-bit* tree, whose edge of
  distance d joins c to c - d where d is c's lowest set bit (reduce, gather and scatter
  traverse it, up or down), and the *high-bit* tree, whose edge of distance d joins
  v < d to v + d (broadcast, barrier release; Gloo's broadcast is this tree too);
* **recursive halving / doubling** between partners v ^ d on a power-of-two core, with
  MPICH's folding (`Fold`) for other world sizes.

The registry in `simdist.collectives.algorithms` names these functions, with the closed
forms of their cost; `simdist.collectives.gloo` builds Gloo's message programs from the
same trees and ring.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import lru_cache

import numpy as np

from simdist.collectives.schedule import Fold, Pattern, Piece, Schedule, Transfer, same, span, split, split_columns

Block = tuple[int, int]  # (offset, length) in units
Columns = tuple[np.ndarray, np.ndarray]  # (offsets, lengths) of a block table
Columns3 = tuple[np.ndarray, np.ndarray, np.ndarray | int]  # (source offsets, destination offsets, lengths)


def whole(count: int) -> tuple[Piece, ...]:
    """One piece: the whole buffer, at offset 0 on both sides."""
    return ((0, 0, count),)


# =========================================================================== patterns
def distances(p: int) -> list[int]:
    """The binomial distances 1, 2, 4, ... below p (one tree level each)."""
    out, d = [], 1
    while d < p:
        out.append(d)
        d *= 2
    return out


def low_bit_edges(p: int, d: int) -> list[tuple[int, int]]:
    """(child, parent) relative ranks of the low-bit binomial tree at distance d."""
    return [(c, c - d) for c in range(d, p, 2 * d)]


def high_bit_edges(p: int, d: int) -> list[tuple[int, int]]:
    """(parent, child) relative ranks of the high-bit binomial tree at distance d."""
    return [(v, v + d) for v in range(min(d, p - d))]


@lru_cache(maxsize=256)
def ring_pattern(p: int, root: int = 0) -> Pattern:
    """Relative rank i sends to i + 1 (global ranks shifted by `root`)."""
    src = (np.arange(p) + root) % p
    return Pattern.of(src, (src + 1) % p)


@lru_cache(maxsize=256)
def shift_pattern(p: int, k: int) -> Pattern:
    """Rank i sends to i + k."""
    src = np.arange(p)
    return Pattern.of(src, (src + k) % p)


def _ring(s: Schedule, table: Columns, shift: int, steps: int, phase: str, reduce: bool = False, root: int = 0) -> None:
    """`steps` ring steps: at step k relative rank i sends block (i - k + shift) mod p of
    `table` (offsets, lengths) to i + 1, at the same offset on both sides."""
    p = s.p
    offs, lens = table
    block = (np.arange(p)[None, :] - np.arange(steps)[:, None] + shift) % p  # (step, relative rank)
    off, n = offs[block], lens[block]
    off.flags.writeable = n.flags.writeable = False  # each step keeps a row, without a copy
    pattern = ring_pattern(p, root)
    for k in range(steps):
        s.add_columns(pattern, off[k], off[k], n[k], reduce, phase)


def _pairwise(s: Schedule, pieces: Callable[[np.ndarray, np.ndarray], Columns3], phase: str,
              reduce: bool = False) -> None:
    """p - 1 steps: at step k rank i sends pieces(i, j) to j = i + k (one piece each, as
    columns: source offsets, destination offsets, lengths)."""
    p = s.p
    for k in range(1, p):
        pattern = shift_pattern(p, k)
        so, do, n = pieces(pattern.src, pattern.dst)
        s.add_columns(pattern, so, do, np.broadcast_to(n, (p,)), reduce, phase)


def _direct(
    s: Schedule, pieces: Callable[[int], tuple[Piece, ...]], to_root: bool, phase: str, root: int, reduce: bool = False
) -> None:
    """p - 1 steps: rank a = root + k sends to (to_root) or receives from `root`."""
    p = s.p
    for k in range(1, p):
        a = (root + k) % p
        src, dst = (a, root) if to_root else (root, a)
        s.add([Transfer(src, dst, pieces(a), reduce)], phase)


def _tree_up(
    s: Schedule, pieces: Callable[[int, int], tuple[Piece, ...]], phase: str, reduce: bool = False, root: int = 0
) -> None:
    """Low-bit tree towards `root`: child c sends pieces(c, d) to its parent."""
    p = s.p
    for d in distances(p):
        s.add(
            [Transfer((c + root) % p, (q + root) % p, pieces(c, d), reduce) for c, q in low_bit_edges(p, d)], phase
        )


def _tree_down(s: Schedule, pieces: Callable[[int, int], tuple[Piece, ...]], phase: str, root: int = 0) -> None:
    """Low-bit tree away from `root`, widest distance first: the parent sends pieces(c, d)."""
    p = s.p
    for d in reversed(distances(p)):
        s.add([Transfer((q + root) % p, (c + root) % p, pieces(c, d)) for c, q in low_bit_edges(p, d)], phase)


def _bcast_tree(s: Schedule, pieces: tuple[Piece, ...], phase: str, root: int = 0) -> None:
    """High-bit tree from `root`: at distance d every v < d sends `pieces` to v + d."""
    p = s.p
    for d in distances(p):
        s.add([Transfer((v + root) % p, (c + root) % p, pieces) for v, c in high_bit_edges(p, d)], phase)


def _halving(s: Schedule, f: Fold, blocks_of: Callable[[int, int], Block]) -> None:
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


def _doubling(s: Schedule, f: Fold, blocks_of: Callable[[int, int], Block]) -> None:
    """Recursive doubling among virtual ranks: each sends the blocks its group holds."""
    d = 1
    while d < f.p2:
        ts = []
        for v in range(f.p2):
            g = v & ~(d - 1)
            ts.append(Transfer(f.real(v), f.real(v ^ d), same(blocks_of(g, g + d))))
        s.add(ts, "all-gather (doubling)")
        d *= 2


def _fold_in(s: Schedule, f: Fold, pieces: Callable[[int], tuple[Piece, ...]], reduce: bool) -> None:
    s.add([Transfer(e, o, pieces(e), reduce) for e, o in f.extras()], "fold in")


def _fold_out(s: Schedule, f: Fold, pieces: Callable[[int], tuple[Piece, ...]]) -> None:
    s.add([Transfer(o, e, pieces(e)) for e, o in f.extras()], "fold out")


def _merge(pieces: list[Piece]) -> tuple[Piece, ...]:
    """Merge adjacent pieces (contiguous on both sides) into one."""
    out: list[Piece] = []
    for so, do, n in sorted(pieces):
        if out and out[-1][0] + out[-1][2] == so and out[-1][1] + out[-1][2] == do:
            a, b, m = out[-1]
            out[-1] = (a, b, m + n)
        else:
            out.append((so, do, n))
    return tuple(out)


# =========================================================================== all_reduce
def ar_ring(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_reduce", "ring", p, count, count, root)
    blocks = split_columns(count, p)
    _ring(s, blocks, 0, p - 1, "reduce-scatter", reduce=True)
    _ring(s, blocks, 1, p - 1, "all-gather")
    return s


def ar_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_reduce", "tree", p, count, count, root)
    _tree_up(s, lambda c, d: whole(count), "reduce", reduce=True)
    _bcast_tree(s, whole(count), "broadcast")
    return s


def ar_recursive_doubling(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_reduce", "recursive_doubling", p, count, count, root)
    f = Fold(p)
    _fold_in(s, f, lambda e: whole(count), True)
    for d in distances(f.p2):
        s.add([Transfer(f.real(v), f.real(v ^ d), whole(count), True) for v in range(f.p2)], "exchange")
    _fold_out(s, f, lambda e: whole(count))
    return s


def ar_rabenseifner(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_reduce", "rabenseifner", p, count, count, root)
    f = Fold(p)
    blocks = split(count, f.p2)
    _fold_in(s, f, lambda e: whole(count), True)
    _halving(s, f, lambda lo, hi: span(blocks, lo, hi))
    _doubling(s, f, lambda lo, hi: span(blocks, lo, hi))
    _fold_out(s, f, lambda e: whole(count))
    return s


# =========================================================================== broadcast / reduce
def bc_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("broadcast", "tree", p, count, count, root)
    _bcast_tree(s, whole(count), "broadcast", root)
    return s


def bc_scatter_allgather(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("broadcast", "scatter_allgather", p, count, count, root)
    blocks = split(count, p)  # block j belongs to relative rank j
    _tree_down(s, lambda c, d: same(span(blocks, c, min(c + d, p))), "scatter", root)
    _ring(s, split_columns(count, p), 0, p - 1, "ring all-gather", root=root)
    return s


def bc_direct(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("broadcast", "direct", p, count, count, root)
    _direct(s, lambda a: whole(count), False, "send", root)
    return s


def rd_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce", "tree", p, count, count, root)
    _tree_up(s, lambda c, d: whole(count), "reduce", reduce=True, root=root)
    return s


def rd_direct(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce", "direct", p, count, count, root)
    _direct(s, lambda a: whole(count), True, "receive", root, reduce=True)
    return s


# =========================================================================== all_gather
def ag_ring(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_gather", "ring", p, count, p * count, root)
    _ring(s, (np.arange(p) * count, np.full(p, count)), 0, p - 1, "ring")
    return s


def ag_recursive_doubling(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_gather", "recursive_doubling", p, count, p * count, root)
    f = Fold(p)
    blocks = [(i * count, count) for i in range(p)]
    _fold_in(s, f, lambda e: same(blocks[e]), False)
    _doubling(s, f, lambda v_lo, v_hi: span(blocks, *f.block_range(v_lo, v_hi)))

    def all_but_own(e: int) -> tuple[Piece, ...]:
        """What extra rank e lacks at the end: every block but its own."""
        before, after = same(span(blocks, 0, e))[0], same(span(blocks, e + 1, p))[0]
        return tuple(pc for pc in (before, after) if pc[2] > 0)

    _fold_out(s, f, all_but_own)
    return s


def ag_pairwise(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_gather", "pairwise", p, count, p * count, root)
    _pairwise(s, lambda i, j: (i * count, i * count, count), "exchange")
    return s


# =========================================================================== reduce_scatter
def rs_ring(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce_scatter", "ring", p, count, count, root)
    _ring(s, split_columns(count, p), -1, p - 1, "ring", reduce=True)
    return s


def rs_recursive_halving(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce_scatter", "recursive_halving", p, count, count, root)
    f = Fold(p)
    blocks = split(count, p)
    _fold_in(s, f, lambda e: whole(count), True)
    _halving(s, f, lambda v_lo, v_hi: span(blocks, *f.block_range(v_lo, v_hi)))
    _fold_out(s, f, lambda e: same(blocks[e]))
    return s


def rs_pairwise(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("reduce_scatter", "pairwise", p, count, count, root)
    offs, lens = split_columns(count, p)
    _pairwise(s, lambda i, j: (offs[j], offs[j], lens[j]), "exchange", reduce=True)
    return s


# =========================================================================== all_to_all
def a2a_pairwise(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("all_to_all", "pairwise", p, count, 2 * count, root)
    q = count // p
    _pairwise(s, lambda i, j: (j * q, count + i * q, q), "exchange")
    return s


# =========================================================================== gather / scatter
def gather_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("gather", "tree", p, count, p * count, root)

    def carried(c: int, d: int) -> tuple[Piece, ...]:
        """The blocks of relative ranks c .. c+d-1, which c has gathered, at their absolute offsets."""
        absolute = [(j + root) % p for j in range(c, min(c + d, p))]
        return _merge([(a * count, a * count, count) for a in absolute])

    _tree_up(s, carried, "gather", root=root)
    return s


def gather_direct(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("gather", "direct", p, count, p * count, root)
    _direct(s, lambda a: ((a * count, a * count, count),), True, "receive", root)
    return s


def scatter_tree(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("scatter", "tree", p, count, count, root)
    blocks = split(count, p)  # block a belongs to rank a
    _tree_down(s, lambda c, d: _merge([same(blocks[(j + root) % p])[0] for j in range(c, min(c + d, p))]), "scatter", root)
    return s


def scatter_direct(p: int, count: int, root: int = 0) -> Schedule:
    s = Schedule("scatter", "direct", p, count, count, root)
    blocks = split(count, p)
    _direct(s, lambda a: same(blocks[a]), False, "send", root)
    return s


# =========================================================================== barrier
def barrier_dissemination(p: int, count: int = 0, root: int = 0) -> Schedule:
    s = Schedule("barrier", "dissemination", p, 0, 0, root)
    for d in distances(p):
        s.add([Transfer(i, (i + d) % p, ()) for i in range(p)], "signal")
    return s


def barrier_tree(p: int, count: int = 0, root: int = 0) -> Schedule:
    s = Schedule("barrier", "tree", p, 0, 0, root)
    _tree_up(s, lambda c, d: (), "gather")
    _bcast_tree(s, (), "release")
    return s
