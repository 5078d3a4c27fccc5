"""Contention-aware step-level execution of several collectives on shared links.

Given collectives with start times, run each one's schedule over the FIFO links of a
`Network` (`simdist.network.links`) and return when each finishes. Concurrent
collectives (and point-to-point sends, op ``"send"`` with ranks ``[src, dst]``) queue on
the links they share, so contention shows up in the finish times.

The dependency rules are those of `simdist.collectives.execute.run_times` (a transfer of
step k starts when both ends finished step k-1); with one collective and no link shared
within a step, the result equals the no-contention time, hence the closed form on a
uniform network.

Two executors give the same times:
  * `simdist.network.replay` walks the steps in order with whole-step array arithmetic,
    no event queue. It applies when every link is reached by messages in step order
    (always true on a non-blocking switch, and whenever contention is the same in every
    step), and says so;
  * `simdist.network.events` processes message arrivals at links in time order, for
    everything else. Both do the same additions in the same order, so where the replay
    applies the two agree exactly (a test compares them on every algorithm and preset).
`simulate` tries the replay and falls back to the events.
"""

from __future__ import annotations

from simdist.network.events import run_events
from simdist.network.links import LinkState
from simdist.network.replay import replay
from simdist.network.runs import CollectiveRequest, CollectiveResult, TransferLog, TransferRecord, prepare
from simdist.network.topology import Network
from simdist.report import RankResult, Report, TraceEntry

__all__ = ["CollectiveRequest", "CollectiveResult", "TransferLog", "TransferRecord", "simulate", "simulate_events",
           "simulate_replay", "timeline_report"]


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
    from_replay = simulate_replay(network, requests, cost_model, record, utilization)
    if from_replay is not None:
        return from_replay
    return simulate_events(network, requests, cost_model, record, utilization)


def simulate_replay(network: Network, requests: list[CollectiveRequest], cost_model=None, record: bool = True,
                    utilization: dict | None = None) -> list[CollectiveResult] | None:
    """The results without an event queue, or None where the schedule needs one."""
    runs = prepare(network, requests, cost_model)
    links = LinkState(network.links)
    results = replay(runs, links, network.gamma, record, busy=utilization is not None)
    if results is not None:
        _utilization(results, links, utilization)
    return results


def simulate_events(network: Network, requests: list[CollectiveRequest], cost_model=None, record: bool = True,
                    utilization: dict | None = None) -> list[CollectiveResult]:
    """The results from message arrivals processed in time order (any contention)."""
    runs = prepare(network, requests, cost_model)
    links = LinkState(network.links)
    results = run_events(runs, links, network.gamma, record)
    _utilization(results, links, utilization)
    return results


def _utilization(results: list[CollectiveResult], links: LinkState, out: dict | None) -> None:
    if out is not None:
        out.update(links.utilization(max((r.finish for r in results), default=0.0)))


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
