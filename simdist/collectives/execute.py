"""Executing schedules: on real numbers (numpy), and in time without contention.

`run_values` proves a schedule computes what its collective means; `run_times` gives the
no-contention completion time of every transfer with per-pair (alpha, beta) costs, using
the same dependency rules as the simpy executor in `simdist.network.simulate`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass

import numpy as np

from simdist.collectives.schedule import Schedule, split

# (src ranks, dst ranks) -> (alpha s, beta s/byte) per pair, as arrays (or two numbers for all)
PairCost = Callable[[np.ndarray, np.ndarray], tuple[np.ndarray | float, np.ndarray | float]]


# --------------------------------------------------------------------------- values
def initial_buffers(s: Schedule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Working buffers before step 0 from per-rank inputs (each `count` long).

    all_gather/gather: own contribution at its block; scatter: root's input everywhere
    else zero; all_to_all: [input | output] with the own block already copied.
    """
    p, c = s.p, s.count
    bufs = [np.zeros(s.buf_count, dtype=np.float64) for _ in range(p)]
    for i in range(p):
        x = np.asarray(inputs[i], dtype=np.float64)
        if s.op in ("all_gather", "gather"):
            bufs[i][i * c : (i + 1) * c] = x
        elif s.op == "all_to_all":
            bufs[i][:c] = x
            q = c // p
            bufs[i][c + i * q : c + (i + 1) * q] = x[i * q : (i + 1) * q]
        elif s.op == "barrier":
            pass
        elif s.op in ("broadcast", "scatter"):
            if i == s.root:
                bufs[i][:c] = x
        else:
            bufs[i][:c] = x
    return bufs


def run_values(s: Schedule, inputs: list[np.ndarray]) -> list[np.ndarray]:
    """Execute the schedule on numbers; returns every rank's final working buffer."""
    bufs = initial_buffers(s, inputs)
    for step in s.steps:
        snap = {t.src: bufs[t.src].copy() for t in step}
        for t in step:
            for so, do, n in t.pieces:
                data = snap[t.src][so : so + n]
                if t.reduce:
                    bufs[t.dst][do : do + n] += data
                else:
                    bufs[t.dst][do : do + n] = data
    return bufs


def expected_outputs(s: Schedule, inputs: list[np.ndarray]) -> dict[int, tuple[slice, np.ndarray]]:
    """rank -> (slice of its buffer, the values the collective must leave there)."""
    p, c = s.p, s.count
    xs = [np.asarray(x, dtype=np.float64) for x in inputs]
    total = np.sum(xs, axis=0) if xs else np.zeros(0)
    out: dict[int, tuple[slice, np.ndarray]] = {}
    if s.op == "all_reduce":
        out = {i: (slice(0, c), total) for i in range(p)}
    elif s.op == "reduce":
        out = {s.root: (slice(0, c), total)}
    elif s.op == "broadcast":
        out = {i: (slice(0, c), xs[s.root]) for i in range(p)}
    elif s.op == "all_gather":
        out = {i: (slice(0, p * c), np.concatenate(xs)) for i in range(p)}
    elif s.op == "gather":
        out = {s.root: (slice(0, p * c), np.concatenate(xs))}
    elif s.op == "reduce_scatter":
        for i, (off, n) in enumerate(split(c, p)):
            out[i] = (slice(off, off + n), total[off : off + n])
    elif s.op == "scatter":
        for i, (off, n) in enumerate(split(c, p)):
            out[i] = (slice(off, off + n), xs[s.root][off : off + n])
    elif s.op == "all_to_all":
        q = c // p
        for i in range(p):
            out[i] = (slice(c, c + p * q), np.concatenate([xs[j][i * q : (i + 1) * q] for j in range(p)]))
    return out


def knowledge(s: Schedule) -> list[set[int]]:
    """Which ranks' arrival each rank has (transitively) heard of by the end: a barrier
    is correct when every set is all ranks."""
    know = [{i} for i in range(s.p)]
    for step in s.steps:
        snap = [set(k) for k in know]
        for t in step:
            know[t.dst] |= snap[t.src]
    return know


# --------------------------------------------------------------------------- times
@dataclass(frozen=True, slots=True)
class TransferTime:
    step: int
    src: int
    dst: int
    nbytes: int
    reduce: bool
    start: float
    end: float  # arrival (+ reduction) at dst


class StepTimes(Sequence[TransferTime]):
    """When each step ended (`step_end[k]`: its last message), and when recorded, when
    every message started and ended (`begin[k]`, `end[k]`: arrays over step k's
    messages); indexing gives `TransferTime`s."""

    def __init__(self, s: Schedule, unit_bytes: float):
        self.schedule = s
        self.unit_bytes = unit_bytes
        self.step_end: list[float] = []
        self.begin: list[np.ndarray] = []
        self.end: list[np.ndarray] = []

    def __len__(self) -> int:
        return sum(len(b) for b in self.begin)

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        if i < 0:
            i += len(self)
        for k, b in enumerate(self.begin):
            if i < len(b):
                t = self.schedule.steps[k][i]
                return TransferTime(k, t.src, t.dst, int(t.count * self.unit_bytes), t.reduce, float(b[i]),
                                    float(self.end[k][i]))
            i -= len(b)
        raise IndexError("message index out of range")

    def __iter__(self) -> Iterator[TransferTime]:
        return (self[i] for i in range(len(self)))


def run_times(
    s: Schedule,
    pair_cost: PairCost,
    gamma: float,
    unit_bytes: float = 1.0,
    start: list[float] | float = 0.0,
    record: bool = False,
) -> tuple[list[float], StepTimes]:
    """No-contention timing: per-rank finish times (and every transfer if `record`).

    A transfer of step k starts when both its sender and its receiver have finished step
    k-1 (a rendezvous: the receiver posts its receive in program order, as Gloo's and
    MPI's blocking receives do), takes alpha + bytes*beta of its route, then gamma per
    byte if the receiver reduces it. A rank finishes step k when all its step-k
    transfers are done. Steps are computed whole (arrays over their messages), and
    `pair_cost` is asked once per step pattern, for all its pairs.
    """
    p = s.p
    ready = np.array(start if isinstance(start, list) else [float(start)] * p, dtype=np.float64)
    log = StepTimes(s, unit_bytes)
    costs: dict[int, tuple[np.ndarray, np.ndarray]] = {}
    for step in s.steps:
        pattern = step.pattern
        ab = costs.get(id(pattern))
        if ab is None:
            ab = costs[id(pattern)] = pair_cost(pattern.src, pattern.dst)
        nbytes = step.count * unit_bytes
        begin = np.maximum(ready[pattern.src], ready[pattern.dst])
        done = begin + ab[0] + nbytes * ab[1] + np.where(step.reduce, nbytes * gamma, 0.0)
        ready = ready.copy()
        np.maximum.at(ready, pattern.src, done)
        np.maximum.at(ready, pattern.dst, done)
        log.step_end.append(float(done.max()))
        if record:
            log.begin.append(begin)
            log.end.append(done)
    return ready.tolist(), log


def schedule_time(s: Schedule, pair_cost: PairCost, gamma: float, unit_bytes: float = 1.0) -> float:
    """Completion time of the whole collective without contention."""
    if not s.steps:
        return 0.0
    fin, _ = run_times(s, pair_cost, gamma, unit_bytes)
    return max(fin)
