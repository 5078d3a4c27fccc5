"""Step-level schedules: who sends which piece of which buffer to whom at each step.

A `Schedule` runs on p local ranks (0..p-1; the cost model maps them to global ranks).
Each rank owns a working buffer of `buf_count` units (bytes for costing, elements when a
test executes the schedule on numpy arrays). A `Transfer` is one message: from `src` to
`dst`, one or more pieces ``(src_off, dst_off, count)``, and `reduce` says whether the
receiver adds the pieces into its buffer (the reduction costs gamma per byte) or copies
them over.

Semantics shared by every executor (numpy, timing without contention, step-level
simulation with links):
  * steps run in order on each rank; a message of step k starts when both its sender and
    its receiver have finished step k-1 (a rendezvous, as blocking receives posted in
    program order behave);
  * a message carries the sender's data as it was when the sender finished step k-1
    (so a pairwise exchange within one step sends both old values);
  * a rank's step is done when every message it sends or receives in that step has
    arrived (and been reduced, for a reducing receive).
Transfers with src == dst never occur; local copies are part of the buffer layout.

A step is held as columns (numpy arrays: sources, destinations, counts, offsets), not as
one object per message: a ring all_reduce on 1,024 ranks has two million messages, and
the timing executors work on a step's columns at once. The pairs of a step (`Pattern`)
are shared by every step that moves data between the same ranks (all steps of a ring
phase), so per-pair work (routes, pair costs) is done once per pattern. Iterating a step
still yields `Transfer` objects, for code that reads messages one by one.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field
from functools import cached_property, lru_cache

import numpy as np

Piece = tuple[int, int, int]  # (src_off, dst_off, count) in units


@dataclass(frozen=True, slots=True)
class Transfer:
    src: int
    dst: int
    pieces: tuple[Piece, ...]
    reduce: bool = False

    @property
    def count(self) -> int:
        return sum(c for _, _, c in self.pieces)


def _frozen(a: Sequence[int] | np.ndarray, dtype: type = np.int64) -> np.ndarray:
    arr = np.array(a, dtype=dtype)
    arr.flags.writeable = False  # shared between steps: nobody may change it under another
    return arr


@dataclass(frozen=True, eq=False)
class Pattern:
    """The pairs of one step: message i goes from local rank src[i] to dst[i]."""

    src: np.ndarray
    dst: np.ndarray

    @classmethod
    def of(cls, src: Sequence[int] | np.ndarray, dst: Sequence[int] | np.ndarray) -> Pattern:
        return cls(_frozen(src), _frozen(dst))

    def __len__(self) -> int:
        return len(self.src)

    @cached_property
    def loops(self) -> bool:
        """Some message goes from a rank to itself (a generator's formula at small p): dropped."""
        return bool((self.src == self.dst).any())

    @cached_property
    def one_per_rank(self) -> bool:
        """No rank sends twice and none receives twice (rank-indexed updates need no `.at`)."""
        n = len(self.src)
        return len(np.unique(self.src)) == n and len(np.unique(self.dst)) == n


@dataclass(frozen=True, eq=False)
class Step:
    """One step's messages as columns. Every message has one piece at `src_off`/`dst_off`
    of `count` units, except in steps built with `multi` (a message made of several pieces,
    or of none: a barrier's signal), whose pieces are listed there."""

    pattern: Pattern
    count: np.ndarray  # units per message (the sum of its pieces)
    reduce: np.ndarray  # bool per message
    src_off: np.ndarray | None = None
    dst_off: np.ndarray | None = None
    multi: tuple[tuple[Piece, ...], ...] | None = field(default=None, repr=False)

    @property
    def src(self) -> np.ndarray:
        return self.pattern.src

    @property
    def dst(self) -> np.ndarray:
        return self.pattern.dst

    def __len__(self) -> int:
        return len(self.pattern)

    def pieces(self, i: int) -> tuple[Piece, ...]:
        if self.multi is not None:
            return self.multi[i]
        assert self.src_off is not None and self.dst_off is not None
        return ((int(self.src_off[i]), int(self.dst_off[i]), int(self.count[i])),)

    def __getitem__(self, i: int) -> Transfer:
        return Transfer(int(self.src[i]), int(self.dst[i]), self.pieces(i), bool(self.reduce[i]))

    def __iter__(self) -> Iterator[Transfer]:
        return (self[i] for i in range(len(self)))

    @classmethod
    def of_transfers(cls, transfers: list[Transfer]) -> Step:
        """A step from messages listed one by one (the patterns with few messages per step)."""
        pattern = Pattern.of([t.src for t in transfers], [t.dst for t in transfers])
        count = _frozen([t.count for t in transfers])
        reduce = _frozen([t.reduce for t in transfers], np.bool_)
        if all(len(t.pieces) == 1 for t in transfers):
            return cls(pattern, count, reduce, _frozen([t.pieces[0][0] for t in transfers]),
                       _frozen([t.pieces[0][1] for t in transfers]))
        return cls(pattern, count, reduce, multi=tuple(t.pieces for t in transfers))


@dataclass
class Schedule:
    op: str
    algo: str
    p: int
    count: int  # units of the per-rank input (all_gather/gather: per-rank contribution)
    buf_count: int  # units in each rank's working buffer
    root: int = 0
    steps: list[Step] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)  # a label per step, for tables

    def add(self, transfers: list[Transfer], phase: str = "") -> None:
        transfers = [t for t in transfers if t.src != t.dst]
        if transfers:
            self.steps.append(Step.of_transfers(transfers))
            self.phases.append(phase)

    def add_columns(self, pattern: Pattern, src_off: np.ndarray, dst_off: np.ndarray, count: np.ndarray,
                    reduce: bool, phase: str = "") -> None:
        """A step of single-piece messages given as columns (the patterns with p messages a
        step). The step keeps the arrays given (read-only from now on), without a copy."""
        if pattern.loops:
            keep = pattern.src != pattern.dst
            pattern = Pattern.of(pattern.src[keep], pattern.dst[keep])
            src_off, dst_off, count = src_off[keep], dst_off[keep], count[keep]
        if len(pattern):
            same_off = dst_off is src_off
            src_off, count = _owned(src_off), _owned(count)
            self.steps.append(Step(pattern, count, _flags(len(pattern), reduce), src_off,
                                   dst_off=src_off if same_off else _owned(dst_off)))
            self.phases.append(phase)

    @property
    def units_sent(self) -> int:
        """Total units on the wire, summed over every message."""
        return sum(int(st.count.sum()) for st in self.steps)

    @property
    def messages(self) -> int:
        return sum(len(step) for step in self.steps)


def _owned(a: np.ndarray) -> np.ndarray:
    arr = np.asarray(a, dtype=np.int64)
    base = arr.base
    if base is not None and (arr.flags.writeable or not arr.flags.c_contiguous or base.flags.writeable):
        arr = arr.copy()  # a view of an array someone may still change (or a broadcast): own a copy
    arr.flags.writeable = False
    return arr


@lru_cache(maxsize=1024)
def _flags(n: int, flag: bool) -> np.ndarray:
    """A read-only bool column, shared by every step with n messages and this flag."""
    return _frozen(np.full(n, flag), np.bool_)


def split_columns(count: int, parts: int) -> tuple[np.ndarray, np.ndarray]:
    """(offsets, lengths) of `parts` nearly equal blocks (numpy.array_split's rule)."""
    q, r = divmod(count, parts)
    lens = np.full(parts, q, dtype=np.int64)
    lens[:r] += 1
    offs = np.zeros(parts, dtype=np.int64)
    np.cumsum(lens[:-1], out=offs[1:])
    return offs, lens


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """(offset, length) of `parts` nearly equal blocks (numpy.array_split's rule)."""
    offs, lens = split_columns(count, parts)
    return list(zip(offs.tolist(), lens.tolist(), strict=True))


def span(blocks: list[tuple[int, int]], lo: int, hi: int) -> tuple[int, int]:
    """(offset, length) covering blocks lo..hi-1 (contiguous)."""
    if hi <= lo:
        return (blocks[lo][0] if lo < len(blocks) else 0, 0)
    start = blocks[lo][0]
    end = blocks[hi - 1][0] + blocks[hi - 1][1]
    return (start, end - start)


def same(off_len: tuple[int, int]) -> tuple[Piece, ...]:
    """A single piece at the same offset on both sides."""
    off, n = off_len
    return ((off, off, n),)


def pow2_floor(p: int) -> int:
    return 1 << (p.bit_length() - 1)


def ceil_log2(p: int) -> int:
    return (p - 1).bit_length()


# --------------------------------------------------------------------------- folding
class Fold:
    """MPICH's way to run a power-of-two algorithm on p ranks: with p2 = 2^floor(lg p) and
    r = p - p2, the first 2r ranks pair up (2i, 2i+1); the even one hands its data to the
    odd one before and gets the result back after. Virtual rank v (0..p2-1) is real rank
    2v+1 for v < r and v + r otherwise."""

    def __init__(self, p: int):
        self.p = p
        self.p2 = pow2_floor(p)
        self.r = p - self.p2

    def real(self, v: int) -> int:
        return 2 * v + 1 if v < self.r else v + self.r

    def reals(self, v: int) -> list[int]:
        """Real ranks whose data virtual rank v carries, ascending."""
        return [2 * v, 2 * v + 1] if v < self.r else [v + self.r]

    def block_range(self, v_lo: int, v_hi: int) -> tuple[int, int]:
        """Per-real-rank block indices [lo, hi) owned by virtual ranks v_lo..v_hi-1."""
        if v_hi <= v_lo:
            return (0, 0)
        return (self.reals(v_lo)[0], self.reals(v_hi - 1)[-1] + 1)

    def extras(self) -> list[tuple[int, int]]:
        """(even extra rank, odd partner) pairs."""
        return [(2 * i, 2 * i + 1) for i in range(self.r)]
