"""The one Chrome trace writer: every timeline simdist draws, in the Trace Event Format.

The input is a `Report` and nothing else (per rank: each operation's issue and completion
times, `TraceEntry.t_issue`/`t_done`, and the rank's own work between calls,
`RankResult.compute`), so anything that produces a report can be drawn: the simulator, the
real backend, the cost model's message timeline (`simdist.network.simulate.timeline_report`)
and any later backend that times ranks. The output opens in Perfetto (ui.perfetto.dev) and
chrome://tracing, and is valid by the format's rules:

* one process per rank (``pid = rank + 1``; pid 0 is the idle process to Perfetto), named
  "rank r" and sorted by rank; its main thread ("rank r: calls and compute") holds
  complete events ("X") for *blocking* operations (the rank is inside the call from issue
  to completion) and compute spans. These never overlap on a rank that blocks; an item
  that would cross the previous one (jitter in measured times) goes to an async lane
  instead, so slices on a thread track always nest;
* async operations (issued with ``async_op=True``, waited later or never) are async slices
  ("b"/"e") on async tracks: lanes assigned greedily so that slices in one lane never
  overlap or touch, which keeps concurrent work side by side instead of drawn as parent
  and child;
* flow arrows (flow events v2: ``bind_id`` with ``flow_out``/``flow_in`` on the slice
  itself, so an arrow binds to exactly that slice, async ones included) chain the
  operations that were matched with each other, in issue order: the members of one
  collective (same group and sequence number), a send and the recv it pairs with (the
  k-th send from a to b with the k-th recv at b from a). An operation matched with
  nobody gets no arrow, so no flow dangles;
* an operation that never completed ends where its rank stopped (an error) or, on a rank
  that hangs, at the end of the trace (past the last event), with ``completed: false``;
  an instant event marks where a rank that did not complete stopped.

Times are seconds in the report and microseconds in the trace. Each is rounded to whole
nanoseconds and written as ``(ns + 1/4) / 1000``: a reader that truncates (Perfetto reads
``ts * 1000`` into integer nanoseconds) and one that rounds both recover the same integer,
so slices that touch in the report touch, and never cross, in the viewer.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simdist.jsonout import dumps
from simdist.report import RankResult, Report, TraceEntry
from simdist.vocab import P2P_OPS

OPEN_TAIL = 0.02  # an op that never completes runs this fraction of the run past its end


@dataclass
class _Item:
    """One slice to draw on a rank: an operation or a compute span."""

    begin_ns: int
    end_ns: int
    name: str
    cat: str
    args: dict[str, Any]
    blocking: bool
    flow: tuple[int, bool, bool] | None = None  # (bind id, flow_in, flow_out)


@dataclass
class _Lanes:
    """Greedy interval partitioning: the first lane whose last slice ended before `begin`."""

    ends: list[int] = field(default_factory=list)

    def place(self, begin: int, end: int) -> int:
        for k, last in enumerate(self.ends):
            if last < begin:  # strictly: an "e" and a "b" at one instant could be read in either order
                self.ends[k] = end
                return k
        self.ends.append(end)
        return len(self.ends) - 1


def _ns(t: float) -> int:
    return int(round(t * 1e9))


def _us(ns: int) -> float:
    return (ns + 0.25) / 1000.0


def to_chrome_trace(report: Report) -> dict[str, Any]:
    """The trace as a JSON-ready dict (``{"traceEvents": [...], ...}``)."""
    last = _last_time(report)
    tail = _ns(last + max(OPEN_TAIL * last, 1e-6)) if any(_open(r) for r in report.ranks) else _ns(last)
    flows = _flows(report)
    events: list[dict[str, Any]] = []
    for r in report.ranks:
        pid = r.rank + 1
        events += [
            {"name": "process_name", "ph": "M", "pid": pid, "args": {"name": f"rank {r.rank}"}},
            {"name": "process_sort_index", "ph": "M", "pid": pid, "args": {"sort_index": r.rank}},
            {"name": "thread_name", "ph": "M", "pid": pid, "tid": pid,
             "args": {"name": f"rank {r.rank}: calls and compute"}},
        ]
        items = [_op_item(r, k, e, tail, flows.get((r.rank, k))) for k, e in enumerate(r.trace)]
        items += [_Item(_ns(c.t_begin), max(_ns(c.t_end), _ns(c.t_begin)), c.label, "compute",
                        {"seconds": c.t_end - c.t_begin}, True) for c in r.compute]
        events += _draw(pid, items)
        if r.status != "completed":
            events.append({"name": r.status, "cat": "status", "ph": "i", "s": "t", "pid": pid, "tid": pid,
                           "ts": _us(_ns(r.time)),
                           "args": {"error": r.error.message if r.error else None,
                                    "blocked_in": r.blocked_in.short() if r.blocked_in else None}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"scenario": report.scenario, "source": report.source, "outcome": report.outcome,
                          "writer": "simdist.chrome_trace"}}


def write_chrome_trace(report: Report, path: str | Path) -> Path:
    """Write the trace of `report` to `path` (its folder must exist: the CLI checks it first)."""
    p = Path(path)
    p.write_text(dumps(to_chrome_trace(report), indent=None))  # valid JSON: a value may be inf
    return p


def _open(r: RankResult) -> bool:
    """Does some op of this rank run to the end of the trace (never completed on a hung rank)?"""
    return r.status == "hang" and any(e.t_done is None for e in r.trace)


def _last_time(report: Report) -> float:
    times = [0.0]
    for r in report.ranks:
        times.append(r.time)
        times += [e.t_done if e.t_done is not None else e.t_issue for e in r.trace]
        times += [c.t_end for c in r.compute]
    return max(times)


def _op_item(r: RankResult, k: int, e: TraceEntry, tail: int, flow: tuple[int, bool, bool] | None) -> _Item:
    begin = _ns(e.t_issue)
    if e.t_done is not None:
        end = _ns(e.t_done)
    else:  # never completed: to where the rank died, or (hang) to the end of the trace
        end = tail if r.status == "hang" else _ns(max(r.time, e.t_issue))
    if e.op in P2P_OPS:
        name = f"{e.op}[{e.numel}] {'to' if e.op == 'send' else 'from'} {e.peer}"
    else:
        name = f"{e.op}[{e.numel}] {e.origin}"
    args: dict[str, Any] = {"seq": e.seq, "group": e.group, "origin": e.origin, "dtype": e.dtype,
                            "phase": e.phase, "iteration": e.iteration, "async_op": e.async_op,
                            "completed": e.completed}
    args.update({k2: v for k2, v in (("reduce_op", e.reduce_op), ("root", e.root), ("peer", e.peer))
                 if v is not None})
    if e.t_done is None:
        args["never_completed"] = True
    return _Item(begin, max(end, begin), name, e.origin.split(".")[0] or "op", args, not e.async_op, flow)


def _draw(pid: int, items: list[_Item]) -> list[dict[str, Any]]:
    """Blocking items on the main thread while they do not overlap; the rest on async lanes."""
    out: list[dict[str, Any]] = []
    main_end = None
    lanes = _Lanes()
    for it in sorted(items, key=lambda i: (i.begin_ns, i.end_ns)):
        ev: dict[str, Any] = {"name": it.name, "cat": it.cat, "pid": pid, "args": it.args}
        if it.flow is not None:
            bind, fin, fout = it.flow
            ev["bind_id"] = bind
            ev.update({"flow_in": True} if fin else {})
            ev.update({"flow_out": True} if fout else {})
        if it.blocking and (main_end is None or it.begin_ns >= main_end):
            main_end = it.end_ns
            out.append({**ev, "ph": "X", "tid": pid, "ts": _us(it.begin_ns), "dur": _us(it.end_ns - it.begin_ns)})
            continue
        lane = lanes.place(it.begin_ns, it.end_ns)
        track = f"rank{pid - 1}.async{lane}"
        ev["cat"] = "async"
        ev["args"] = {**it.args, "lane": lane}
        out.append({**ev, "ph": "b", "id": track, "ts": _us(it.begin_ns)})
        out.append({"name": it.name, "cat": "async", "ph": "e", "pid": pid, "id": track, "ts": _us(it.end_ns)})
    return out


def _flows(report: Report) -> dict[tuple[int, int], tuple[int, bool, bool]]:
    """(rank, trace index) -> (bind id, flow_in, flow_out) for every op matched with another."""
    groups: dict[tuple, list[tuple[int, int]]] = {}
    sent: dict[tuple[int, int], list[int]] = {}
    received: dict[tuple[int, int], list[int]] = {}
    for r in report.ranks:
        for k, e in enumerate(r.trace):
            if e.op not in P2P_OPS:
                groups.setdefault((e.group, e.seq), []).append((r.rank, k))
            elif e.peer is not None and e.op == "send":
                sent.setdefault((r.rank, e.peer), []).append(k)
            elif e.peer is not None:
                received.setdefault((e.peer, r.rank), []).append(k)
    trace = {r.rank: r.trace for r in report.ranks}
    # a collective's members in the order they arrived (the last one let it start)
    chains = [sorted(m, key=lambda m: (trace[m[0]][m[1]].t_issue, m[0])) for m in groups.values() if len(m) > 1]
    for (a, b), ks in sent.items():  # FIFO per (sender, receiver), as Gloo pairs them; send -> recv
        chains += [[(a, ka), (b, kb)] for ka, kb in zip(ks, received.get((a, b), []), strict=False)]
    out: dict[tuple[int, int], tuple[int, bool, bool]] = {}
    for bind, members in enumerate(chains, start=1):
        for i, m in enumerate(members):
            out[m] = (bind, i > 0, i < len(members) - 1)
    return out
