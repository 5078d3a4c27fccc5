"""Contention-aware step-level execution of several collectives on shared links.

Given collectives with start times, run each one's schedule over the FIFO links of a
`Network` in one simpy environment and return when each finishes. Concurrent
collectives (and point-to-point sends, op ``"send"`` with ranks ``[src, dst]``) queue on
the links they share, so contention shows up in the finish times.

The dependency rules are those of `simdist.collectives.execute.run_times` (a transfer of
step k starts when both ends finished step k-1); with one collective and no link shared
within a step, the result equals the no-contention time, hence the closed form on a
uniform network.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import simpy

from simdist.collectives.algorithms import algorithms_for, make_schedule, resolve
from simdist.collectives.schedule import Schedule, Transfer
from simdist.errors import ScenarioError
from simdist.network.links import LinkSet
from simdist.network.topology import Network
from simdist.report import RankResult, Report, TraceEntry


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


@dataclass
class CollectiveResult:
    request: CollectiveRequest
    algo: str
    start: float
    finish: float
    rank_finish: dict[int, float]
    transfers: list[TransferRecord] = field(default_factory=list)

    @property
    def duration(self) -> float:
        return self.finish - self.start


def _send_schedule(nbytes: int) -> Schedule:
    s = Schedule("send", "direct", 2, nbytes, nbytes)
    s.add([Transfer(0, 1, ((0, 0, nbytes),))], "send")
    return s


def simulate(
    network: Network,
    requests: list[CollectiveRequest],
    cost_model=None,
    record: bool = True,
    utilization: dict | None = None,
) -> list[CollectiveResult]:
    """Run all requests together; results in request order.

    `cost_model` (a `simdist.network.cost.CostModel`) picks algorithms for requests with
    algo None; without one, None means the first registered algorithm for the op.
    """
    env = simpy.Environment()
    links = LinkSet(env, network)
    gamma = network.gamma
    results: list[CollectiveResult] = []
    finishers = []
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
        res = CollectiveResult(req, algo, req.start, req.start, {})
        results.append(res)
        finishers.extend(_launch(env, links, gamma, sched, req, ci, res, record))
    env.run()
    for res in results:
        res.finish = max(res.rank_finish.values(), default=res.start)
    if utilization is not None:
        horizon = max((r.finish for r in results), default=0.0)
        utilization.update(links.utilization(horizon))
    return results


def _launch(
    env, links: LinkSet, gamma: float, s: Schedule, req: CollectiveRequest, ci: int, res: CollectiveResult, record: bool
):
    ranks = req.ranks
    start_ev = env.timeout(req.start)
    last = [start_ev for _ in range(s.p)]

    def xfer(t: Transfer, k: int, phase: str, ev_src, ev_dst):
        yield ev_src & ev_dst
        begin = env.now
        nbytes = t.count
        yield from links.send(ranks[t.src], ranks[t.dst], nbytes)
        if t.reduce and nbytes and gamma > 0:
            yield env.timeout(nbytes * gamma)
        if record:
            res.transfers.append(
                TransferRecord(ci, k, phase, ranks[t.src], ranks[t.dst], nbytes, t.reduce, begin, env.now)
            )

    for k, step in enumerate(s.steps):
        phase = s.phases[k] if k < len(s.phases) else ""
        involved: dict[int, list] = {}
        for t in step:
            proc = env.process(xfer(t, k, phase, last[t.src], last[t.dst]))
            involved.setdefault(t.src, []).append(proc)
            involved.setdefault(t.dst, []).append(proc)
        for i, procs in involved.items():
            last[i] = simpy.AllOf(env, [last[i], *procs])

    def finisher(i: int, ev):
        yield ev
        res.rank_finish[ranks[i]] = env.now

    return [env.process(finisher(i, last[i])) for i in range(s.p)]


# --------------------------------------------------------------------------- as a report
def timeline_report(results: list[CollectiveResult], name: str = "timeline") -> Report:
    """The messages of simulated collectives as a `Report`, for the one trace writer
    (`simdist.chrome_trace`): each transfer is a send on its source rank and the recv it
    pairs with on its destination, from when the message started to when it arrived
    (reduction included); concurrent messages of a rank are async work."""
    per_rank: dict[int, list[TraceEntry]] = {}
    horizon = 0.0
    for ci, res in enumerate(results):
        group = res.request.name or f"{res.request.op}#{ci}"
        for t in sorted(res.transfers, key=lambda t: (t.begin, t.src, t.dst)):
            origin = f"{res.algo}.step{t.step}" + (f".{t.phase}" if t.phase else "")
            for rank, op, peer in ((t.src, "send", t.dst), (t.dst, "recv", t.src)):
                trace = per_rank.setdefault(rank, [])
                trace.append(TraceEntry(seq=len(trace) + 1, op=op, numel=t.nbytes, dtype="uint8", group=group,
                                        group_size=2, origin=origin, peer=peer, async_op=True, phase="loop",
                                        t_issue=t.begin, t_done=t.end, completed=True))
            horizon = max(horizon, t.end)
        for r in res.rank_finish:
            per_rank.setdefault(r, [])
    ranks = [RankResult(rank=r, status="completed", trace=per_rank[r],
                        time=max((e.t_done or 0.0 for e in per_rank[r]), default=0.0)) for r in sorted(per_rank)]
    return Report(scenario=name, source="sim", outcome="completed", ranks=ranks, world_size=len(ranks))
