"""Step-level schedules: who sends which piece of which buffer to whom at each step.

A `Schedule` runs on p local ranks (0..p-1; the cost model maps them to global ranks).
Each rank owns a working buffer of `buf_count` units (bytes for costing, elements when a
test executes the schedule on numpy arrays). A `Transfer` is one message: from `src` to
`dst`, one or more pieces ``(src_off, dst_off, count)``, and `reduce` says whether the
receiver adds the pieces into its buffer (the reduction costs gamma per byte) or copies
them over.

Semantics shared by every executor (numpy, timing without contention, simpy with links):
  * steps run in order on each rank; a message of step k starts when both its sender and
    its receiver have finished step k-1 (a rendezvous, as blocking receives posted in
    program order behave);
  * a message carries the sender's data as it was when the sender finished step k-1
    (so a pairwise exchange within one step sends both old values);
  * a rank's step is done when every message it sends or receives in that step has
    arrived (and been reduced, for a reducing receive).
Transfers with src == dst never occur; local copies are part of the buffer layout.
"""

from __future__ import annotations

from dataclasses import dataclass, field

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


@dataclass
class Schedule:
    op: str
    algo: str
    p: int
    count: int  # units of the per-rank input (all_gather/gather: per-rank contribution)
    buf_count: int  # units in each rank's working buffer
    root: int = 0
    steps: list[list[Transfer]] = field(default_factory=list)
    phases: list[str] = field(default_factory=list)  # a label per step, for tables

    def add(self, transfers: list[Transfer], phase: str = "") -> None:
        transfers = [t for t in transfers if t.src != t.dst]
        if transfers:
            self.steps.append(transfers)
            self.phases.append(phase)

    @property
    def units_sent(self) -> int:
        """Total units on the wire, summed over every message."""
        return sum(t.count for step in self.steps for t in step)

    @property
    def messages(self) -> int:
        return sum(len(step) for step in self.steps)


def split(count: int, parts: int) -> list[tuple[int, int]]:
    """(offset, length) of `parts` nearly equal blocks (numpy.array_split's rule)."""
    q, r = divmod(count, parts)
    out, off = [], 0
    for i in range(parts):
        n = q + (1 if i < r else 0)
        out.append((off, n))
        off += n
    return out


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
