"""What the step-level executors share: the requests, the prepared runs, the results.

A `Run` is one request made ready: its schedule on global ranks and the routes of its
step patterns. Results keep every message as columns (`TransferLog`).
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence
from dataclasses import dataclass, field

import numpy as np

from simdist.collectives.algorithms import algorithms_for, make_schedule, resolve
from simdist.collectives.schedule import Schedule, Transfer
from simdist.errors import ScenarioError
from simdist.network.links import Routes
from simdist.network.topology import Network


@dataclass
class CollectiveRequest:
    op: str  # a collective op name, or "send"
    nbytes: int  # per-rank input bytes (as CostModel.collective_time)
    ranks: list[int]  # global ranks; for "send": [src, dst]
    start: float = 0.0
    algo: str | None = None  # None: the cost model's choice (auto or the scenario's)
    root: int | None = None  # global rank; default ranks[0]
    name: str = ""


@dataclass
class TransferRecord:
    collective: int
    step: int
    phase: str
    src: int  # global ranks
    dst: int
    nbytes: int
    reduce: bool
    begin: float
    end: float


class TransferLog(Sequence[TransferRecord]):
    """Every message of one collective, in schedule order (step by step), as columns: a
    1,024-rank ring has two million of them. Indexing or iterating gives `TransferRecord`s.

    An executor that works step by step hands over its per-step begin and end times
    (`from_steps`); the columns are assembled the first time they are read."""

    def __init__(self, collective: int = 0, phases: Sequence[str] = (), step=(), src=(), dst=(), nbytes=(),
                 reduce=(), begin=(), end=()):
        self.collective = collective
        self.phases = list(phases)
        self._steps: tuple | None = None
        self._length = 0
        self._cols = {
            "step": np.asarray(step, dtype=np.int64), "src": np.asarray(src, dtype=np.int64),
            "dst": np.asarray(dst, dtype=np.int64), "nbytes": np.asarray(nbytes, dtype=np.int64),
            "reduce": np.asarray(reduce, dtype=np.bool_), "begin": np.asarray(begin, dtype=np.float64),
            "end": np.asarray(end, dtype=np.float64),
        }

    @classmethod
    def from_steps(cls, collective: int, schedule: Schedule, ranks: np.ndarray, begin: list[np.ndarray],
                   end: list[np.ndarray]) -> TransferLog:
        """The log of a schedule run step by step: begin[k] and end[k] per message of step k."""
        log = cls(collective, schedule.phases)
        log._steps = (schedule, ranks, begin, end)
        log._length = sum(len(b) for b in begin)
        return log

    def _columns(self) -> dict[str, np.ndarray]:
        if self._steps is not None:
            sched, ranks, begin, end = self._steps
            steps = sched.steps[: len(begin)]
            if steps:
                self._cols = {
                    "step": np.repeat(np.arange(len(steps)), [len(st) for st in steps]),
                    "src": ranks[np.concatenate([st.src for st in steps])],
                    "dst": ranks[np.concatenate([st.dst for st in steps])],
                    "nbytes": np.concatenate([st.count for st in steps]),
                    "reduce": np.concatenate([st.reduce for st in steps]),
                    "begin": np.concatenate(begin), "end": np.concatenate(end),
                }
            self._steps = None
        return self._cols

    def sent_by(self, ranks: list[int]) -> TransferLog:
        """The messages whose source is one of `ranks` (global), as their own log: what a
        per-rank view needs, without assembling every column of a two-million-message log."""
        if self._steps is None:
            keep = np.isin(self.src, ranks)
            c = self._cols
            return TransferLog(self.collective, self.phases, **{k: v[keep] for k, v in c.items()})
        sched, rank_of, begin, end = self._steps
        want = np.isin(rank_of, ranks)  # local ranks among `ranks`
        picks: dict[int, np.ndarray] = {}
        cols: dict[str, list[np.ndarray]] = {k: [] for k in ("step", "src", "dst", "nbytes", "reduce", "begin", "end")}
        for k, st in enumerate(sched.steps[: len(begin)]):
            idx = picks.get(id(st.pattern))
            if idx is None:
                idx = picks[id(st.pattern)] = np.flatnonzero(want[st.src])
            for name, col in (("step", np.full(len(idx), k)), ("src", rank_of[st.src[idx]]),
                              ("dst", rank_of[st.dst[idx]]), ("nbytes", st.count[idx]), ("reduce", st.reduce[idx]),
                              ("begin", begin[k][idx]), ("end", end[k][idx])):
                cols[name].append(col)
        if not cols["step"]:
            return TransferLog(self.collective, self.phases)
        return TransferLog(self.collective, self.phases, **{k: np.concatenate(v) for k, v in cols.items()})

    step = property(lambda self: self._columns()["step"])
    src = property(lambda self: self._columns()["src"])
    dst = property(lambda self: self._columns()["dst"])
    nbytes = property(lambda self: self._columns()["nbytes"])
    reduce = property(lambda self: self._columns()["reduce"])
    begin = property(lambda self: self._columns()["begin"])
    end = property(lambda self: self._columns()["end"])

    def __len__(self) -> int:
        return self._length if self._steps is not None else len(self._cols["step"])

    def __getitem__(self, i):  # type: ignore[override]
        if isinstance(i, slice):
            return [self[j] for j in range(*i.indices(len(self)))]
        c = self._columns()
        k = int(c["step"][i])
        return TransferRecord(self.collective, k, self.phases[k] if k < len(self.phases) else "", int(c["src"][i]),
                              int(c["dst"][i]), int(c["nbytes"][i]), bool(c["reduce"][i]), float(c["begin"][i]),
                              float(c["end"][i]))

    def __iter__(self) -> Iterator[TransferRecord]:
        return (self[i] for i in range(len(self)))


@dataclass
class CollectiveResult:
    request: CollectiveRequest
    algo: str
    start: float
    finish: float
    rank_finish: dict[int, float]
    transfers: TransferLog = field(default_factory=TransferLog)

    @property
    def duration(self) -> float:
        return self.finish - self.start


@dataclass
class Run:
    """One request made ready to execute: its schedule on global ranks, and the routes of
    each of its step patterns (keyed by the pattern's identity: steps share patterns)."""

    index: int
    request: CollectiveRequest
    algo: str
    schedule: Schedule
    ranks: np.ndarray
    routes: dict[int, Routes]

    def route(self, k: int) -> Routes:
        return self.routes[id(self.schedule.steps[k].pattern)]

    def links(self) -> set[int]:
        out: set[int] = set()
        for r in self.routes.values():
            out |= r.links()
        return out

    def result(self, finish: np.ndarray, log: TransferLog | None) -> CollectiveResult:
        """The result from every local rank's finish time (and the messages, if recorded)."""
        rank_finish = dict(zip(self.request.ranks, finish.tolist(), strict=True))
        res = CollectiveResult(self.request, self.algo, self.request.start, self.request.start, rank_finish)
        res.finish = max(rank_finish.values(), default=res.start)
        if log is not None:
            res.transfers = log
        return res


def _send_schedule(nbytes: int) -> Schedule:
    s = Schedule("send", "direct", 2, nbytes, nbytes)
    s.add([Transfer(0, 1, ((0, 0, nbytes),))], "send")
    return s


def prepare(network: Network, requests: list[CollectiveRequest], cost_model=None) -> list[Run]:
    """Check the requests, build their schedules and route their patterns."""
    runs = []
    for ci, req in enumerate(requests):
        for r in req.ranks:
            if not 0 <= r < network.world_size:
                raise ScenarioError(f"ranks: rank {r} out of range for world_size {network.world_size}")
        if req.op == "send":
            if len(req.ranks) != 2 or req.ranks[0] == req.ranks[1]:
                raise ScenarioError("ranks: a send needs [src, dst] with src != dst")
            sched, algo = _send_schedule(int(req.nbytes)), "direct"
        else:
            p = len(req.ranks)
            algo = resolve(req.op, req.algo, "algo")
            if algo is None:
                algo = cost_model.choose(req.op, req.nbytes, p) if cost_model is not None else algorithms_for(req.op)[0]
            root = req.ranks.index(req.root) if req.root is not None and req.root in req.ranks else 0
            sched = make_schedule(req.op, algo, p, int(req.nbytes), root)
        ranks = np.array(req.ranks, dtype=np.int64)
        routes: dict[int, Routes] = {}
        for step in sched.steps:
            if id(step.pattern) not in routes:
                routes[id(step.pattern)] = Routes.of(step.pattern, ranks, network.links)
        runs.append(Run(ci, req, algo, sched, ranks, routes))
    return runs
