"""Every Chrome trace simdist writes is valid by the Trace Event Format, as Perfetto reads it.

The checker below is independent of the writer (`simdist.chrome_trace`): it parses the
JSON and fails on a slice that crosses another on its track (Perfetto truncates or drops
those), async work drawn as parent and child, a missing process/thread/event name, an
async slice that is never closed, and a flow arrow that starts or ends nowhere.
"""

from __future__ import annotations

import json
from collections import defaultdict

import pytest

from simdist.check.explain import annotate_report
from simdist.chrome_trace import to_chrome_trace
from simdist.collectives import algorithms_for
from simdist.network.simulate import timeline_report
from simdist.report import RankResult, Report, Span, TraceEntry
from simdist.scenario import load_scenario
from simdist.sim import simulate
from simdist.timing.explain import explain

from .conftest import SCENARIOS, run_cli

BUNDLED = sorted(SCENARIOS.glob("*.toml"))


def _ns(us: float, rounding: bool) -> int:
    """Microseconds as a reader stores them: truncated (Perfetto) or rounded."""
    return int(round(us * 1000)) if rounding else int(us * 1000)


def trace_problems(doc: dict) -> list[str]:
    """Everything wrong with a trace, one line each (empty: valid)."""
    problems: list[str] = []
    events = doc["traceEvents"]
    procs = {e["pid"] for e in events if e["ph"] == "M" and e["name"] == "process_name" and e["args"].get("name")}
    threads = {(e["pid"], e["tid"]) for e in events if e["ph"] == "M" and e["name"] == "thread_name"
               and e["args"].get("name")}
    for e in events:
        if e["ph"] == "M":
            continue
        if not isinstance(e.get("name"), str) or not e["name"]:
            problems.append(f"event without a name: {e}")
        if e["pid"] not in procs:
            problems.append(f"pid {e['pid']} has no process_name")
        if e["ph"] in ("X", "i") and (e["pid"], e["tid"]) not in threads:
            problems.append(f"thread {(e['pid'], e['tid'])} has no thread_name")
        if e["ph"] == "X" and e["dur"] < 0:
            problems.append(f"negative duration: {e}")
    for rounding in (False, True):
        problems += _thread_problems(events, rounding)
    problems += _async_problems(events)
    problems += _flow_problems(events)
    return problems


def _thread_problems(events: list[dict], rounding: bool) -> list[str]:
    tracks: dict[tuple, list[tuple[int, int, str]]] = defaultdict(list)
    for e in events:
        if e["ph"] == "X" or (e["ph"] == "i" and e.get("s", "t") == "t"):
            start = _ns(e["ts"], rounding)
            tracks[(e["pid"], e["tid"])].append((start, start + _ns(e.get("dur", 0.0), rounding), e["name"]))
    out = []
    for key, slices in tracks.items():
        stack: list[tuple[int, int, str]] = []
        for s in sorted(slices, key=lambda s: (s[0], -s[1])):
            while stack and stack[-1][1] <= s[0] and not (stack[-1][1] == s[0] == s[1] == stack[-1][0]):
                stack.pop()
            if stack and s[1] > stack[-1][1]:
                out.append(f"track {key}: {s[2]} [{s[0]}, {s[1]}] ns crosses {stack[-1][2]} "
                           f"[{stack[-1][0]}, {stack[-1][1]}] ns")
            stack.append(s)
    return out


def _async_problems(events: list[dict]) -> list[str]:
    out = []
    stacks: dict[tuple, list[dict]] = defaultdict(list)
    for e in sorted((e for e in events if e["ph"] in ("b", "e")), key=lambda e: e["ts"]):
        key = (e.get("cat"), e["id"])
        if e["ph"] == "b":
            if stacks[key]:
                out.append(f"async track {key}: {e['name']} drawn as a child of {stacks[key][-1]['name']}")
            stacks[key].append(e)
        elif not stacks[key] or stacks[key][-1]["name"] != e["name"]:
            out.append(f"async track {key}: end of {e['name']} without its begin")
        else:
            stacks[key].pop()
    out += [f"async track {k}: {s[-1]['name']} never ends" for k, s in stacks.items() if s]
    return out


def _flow_problems(events: list[dict]) -> list[str]:
    out = []
    ends: dict[int, list[str]] = defaultdict(list)
    for e in events:
        if "bind_id" not in e:
            continue
        if e["ph"] not in ("X", "b"):
            out.append(f"flow bound to a {e['ph']} event")
        kind = {(False, True): "start", (True, False): "end", (True, True): "step"}.get(
            (bool(e.get("flow_in")), bool(e.get("flow_out"))))
        if kind is None:
            out.append(f"flow {e['bind_id']} without a direction on {e['name']}")
        else:
            ends[e["bind_id"]].append(kind)
    for fid, kinds in ends.items():
        if kinds.count("start") != 1 or kinds.count("end") != 1:
            out.append(f"flow {fid} dangles: {kinds}")
    if any(e["ph"] in ("s", "t", "f") for e in events):
        out.append("v1 flow events (bound by time, not to a slice)")
    return out


def _scenario_trace(path) -> tuple[dict, Report]:
    s = load_scenario(path)
    report = simulate(s)
    annotate_report(report, s)
    return to_chrome_trace(report), report


@pytest.mark.parametrize("path", BUNDLED, ids=lambda p: p.stem)
def test_every_bundled_scenario_trace_is_valid(path):
    doc, report = _scenario_trace(path)
    assert trace_problems(doc) == []
    ops = sum(len(r.trace) for r in report.ranks)
    drawn = [e for e in doc["traceEvents"] if e["ph"] in ("X", "b") and e.get("cat") != "compute"]
    assert len(drawn) == ops  # every operation is on the trace, once
    if report.world_size > 1 and ops:
        assert any("bind_id" in e for e in drawn)  # matched operations are linked


def test_trace_of_the_former_crossing_scenarios_keeps_async_work_apart():
    """ddp_buffers_join crossed: a Join heartbeat [120.027, 150.030] us against a bucket
    rebuild [150.028, 180.032] us on one track. The async heartbeat now has its own lane."""
    doc, report = _scenario_trace(SCENARIOS / "ddp_buffers_join.toml")
    beats = [e for e in doc["traceEvents"] if e["ph"] == "b" and "heartbeat" in e["name"]]
    assert beats and all(e["cat"] == "async" for e in beats)
    assert all(not e.async_op for r in report.ranks for e in r.trace
               if e.origin.endswith("rebuild_buckets"))  # drawn on the main thread
    rebuilds = [e for e in doc["traceEvents"] if e["ph"] == "X" and "rebuild_buckets" in e["name"]]
    assert rebuilds


def test_compute_slices_names_and_flows():
    doc, report = _scenario_trace(SCENARIOS / "ddp_join_kwargs.toml")
    spans = [e for e in doc["traceEvents"] if e.get("cat") == "compute"]
    assert spans and len(spans) == sum(len(r.compute) for r in report.ranks)
    assert all(e["ph"] == "X" and e["dur"] > 0 for e in spans)
    names = {e["args"]["name"] for e in doc["traceEvents"] if e["ph"] == "M" and e["name"] == "process_name"}
    assert names == {f"rank {r}" for r in range(report.world_size)}
    # a flow chains the members of one collective: same group and sequence number on each rank
    by_bind = defaultdict(set)
    for e in doc["traceEvents"]:
        if "bind_id" in e:
            by_bind[e["bind_id"]].add((e["args"]["group"], e["args"]["seq"], e["pid"]))
    for members in by_bind.values():
        assert len({(g, s) for g, s, _ in members}) == 1 and len(members) == report.world_size


def test_blocked_operation_runs_to_the_end_of_the_trace():
    doc, report = _scenario_trace(SCENARIOS / "no_join_hang.toml")
    assert trace_problems(doc) == []
    slices = [e for e in doc["traceEvents"] if e["ph"] in ("X", "b", "e")]
    end = max(e["ts"] + e.get("dur", 0.0) for e in slices)
    blocked = report.ranks[1].blocked_in
    ev = next(e for e in doc["traceEvents"] if e["pid"] == 2 and e["ph"] in ("X", "b")
              and e["args"].get("seq") == blocked.seq and e["args"].get("group") == blocked.group)
    stop = ev["ts"] + ev["dur"] if ev["ph"] == "X" else next(
        e["ts"] for e in doc["traceEvents"] if e["ph"] == "e" and e["id"] == ev["id"] and e["ts"] >= ev["ts"])
    assert stop == end and end > report.ranks[1].time * 1e6
    assert ev["args"]["never_completed"] is True


def test_overlapping_measured_times_never_cross():
    """A backend's measured times may overlap (a blocking op reported done after the next
    issue): the writer moves what would cross to a lane of its own."""
    e1 = TraceEntry(1, "all_reduce", 4, "float32", "WORLD", 2, "user.a", t_issue=0.0, t_done=2e-6, completed=True)
    e2 = TraceEntry(2, "all_reduce", 4, "float32", "WORLD", 2, "user.b", t_issue=1e-6, t_done=3e-6, completed=True)
    r = RankResult(0, "completed", trace=[e1, e2], compute=[Span(0.5e-6, 2.5e-6)], time=3e-6)
    doc = to_chrome_trace(Report("jitter", "real", "completed", [r], world_size=1))
    assert trace_problems(doc) == []
    assert sum(e["ph"] in ("X", "b") for e in doc["traceEvents"]) == 3


@pytest.mark.parametrize("op", ["all_reduce", "all_gather", "broadcast", "reduce_scatter", "all_to_all", "gather"])
@pytest.mark.parametrize("ranks", [2, 5, 8])
def test_cost_model_timelines_are_valid(op, ranks):
    for algo in algorithms_for(op):
        x = explain(op, algo, ranks, 1 << 16)
        report = timeline_report([x.simulation], f"{op}/{algo}")
        doc = to_chrome_trace(report)
        assert trace_problems(doc) == [], (op, algo, ranks)
        sends = [e for e in doc["traceEvents"] if e["ph"] == "b" and e["name"].startswith("send")]
        assert len(sends) == x.messages
        assert all("bind_id" in e for e in sends)  # every message arrow lands on its recv


def test_traces_written_by_the_cli_are_valid(tmp_path):
    run_trace, explain_trace = tmp_path / "run.json", tmp_path / "explain.json"
    res = run_cli("run", str(SCENARIOS / "zero_before_ddp.toml"), "--trace-out", str(run_trace))
    assert res.returncode == 0, res.stderr
    res = run_cli("explain", "all_reduce", "--algo", "rabenseifner", "--ranks", "6", "--trace", str(explain_trace))
    assert res.returncode == 0, res.stderr
    for p in (run_trace, explain_trace):
        assert trace_problems(json.loads(p.read_text())) == [], p.name
