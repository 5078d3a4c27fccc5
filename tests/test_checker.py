"""The checker: failure kinds, wait-for graph / deadlock core, and the explanations in words."""

from __future__ import annotations

import json

import pytest

from simdist.check.classify import check_run
from simdist.check.drawing import draw_waitfor, to_dot, waitfor_figure, write_graph
from simdist.check.explain import annotate_report, explain_report
from simdist.check.waitfor import build_waitfor
from simdist.scenario import load_scenario, parse_scenario
from simdist.sim import simulate
from tests.conftest import SCENARIOS, run_cli


def _run(name: str):
    s = load_scenario(SCENARIOS / f"{name}.toml")
    r = simulate(s)
    return s, r


def test_no_join_hang_missing_rank_explained():
    s, r = _run("no_join_hang")
    v = annotate_report(r, s)
    assert v.failed and v.kind == "hang" and r.outcome == "hang"
    hang = [f for f in r.findings if f.kind == "hang"]
    assert hang and hang[0].ranks == [0] and hang[0].seq == 11
    text = "\n".join(r.notes)
    assert "rank 1 waits in all_reduce #11 (DDP bucket 0, 8 B, group WORLD) issued at input 6" in text
    assert "rank 0 finished its loop after its 5th input" in text
    assert "hint (uneven inputs, no Join)" in text
    wf = v.waitfor
    # a lone waiting rank is not a deadlock core: it waits on a rank that is not blocked
    assert wf is not None and wf.core == [] and wf.roots == [1] and wf.culprits == [0] and not wf.cycle
    assert "deadlock core" not in text and "no cycle: rank 1 waits on ranks [0]" in text


def test_unshadowed_collective_is_a_deadlock_cycle():
    s, r = _run("unshadowed_logging")
    v = annotate_report(r, s)
    assert v.kind == "size_mismatch"  # the engine's mismatch is the root cause
    kinds = {f.kind for f in r.findings}
    assert {"size_mismatch", "deadlock"} <= kinds
    assert v.waitfor is not None and v.waitfor.core == [[0, 1]] and v.waitfor.cycle
    text = "\n".join(r.notes)
    assert "first drift apart at #16" in text and "user collective 'log_loss'" in text
    assert "hint (unshadowed collective): loop[2] ('log_loss')" in text
    # annotating twice adds nothing new
    n = (len(r.findings), len(r.notes))
    annotate_report(r, s)
    assert (len(r.findings), len(r.notes)) == n


def test_family_hints():
    for name, hint in [("zero_before_ddp", "hint (ZeRO listed before DDP)"),
                       ("subset_collective", "hint (collective on a subset of ranks)"),
                       ("forward_collective_syncbn", "hint (forward-pass collective)"),
                       ("join_disabled_uneven", "hint (Join(enable=False))")]:
        s, r = _run(name)
        lines = explain_report(r, s)
        assert any(hint in x for x in lines), (name, lines)


def test_peer_exited_and_abort():
    s, r = _run("no_join_exit")
    v = check_run(r, s)
    assert v.kind == "peer_exited" and v.outcome == "error"
    s, r = _run("forward_collective_syncbn")
    v = check_run(r, s)
    assert v.kind == "size_mismatch" and v.outcome == "error"
    assert any(f.kind == "peer_exited" for f in v.findings)


def test_op_mismatch_primary():
    s, r = _run("subset_collective")
    v = check_run(r, s)
    assert v.kind == "op_mismatch" and v.signature.startswith("op_mismatch/hang/")


def test_p2p_unmatched():
    s = parse_scenario({"world_size": 2, "on_finish": "stay", "inputs": {"counts": [1, 1]},
                        "loop": [{"kind": "p2p", "src": 0, "dst": 1, "ranks": [1]}]})
    r = simulate(s)
    v = annotate_report(r, s)
    assert v.kind == "p2p_unmatched"
    assert any("never posted the matching send" in n for n in r.notes)


def test_correct_run_has_no_findings_or_notes():
    s, r = _run("ddp_zero_join")
    v = annotate_report(r, s)
    assert not v.failed and v.kind == "ok" and r.notes == [] and r.findings == []


def test_invariant_collective_counts():
    # rank 0 issues an async all-reduce it never waits for: the run completes, but not cleanly
    s = parse_scenario({"world_size": 2, "on_finish": "stay", "inputs": {"counts": [1, 1]},
                        "loop": [{"kind": "collective", "op": "all_reduce", "async": True, "wait": "never",
                                  "ranks": [0]}]})
    r = simulate(s)
    v = check_run(r, s)
    assert r.outcome == "completed" and v.failed
    assert v.kind.startswith("invariant:")
    assert {f.kind for f in v.findings} >= {"invariant:collective_counts", "invariant:unfinished_collective"}


def test_waitfor_graph_image(tmp_path):
    s, r = _run("unshadowed_logging")
    wf = build_waitfor(r, s)
    for suffix in (".png", ".svg"):
        p = draw_waitfor(wf, tmp_path / f"wf{suffix}")
        assert p.exists() and p.stat().st_size > 1000
    d = wf.to_dict()
    assert {(e["from"], e["to"]) for e in d["edges"]} == {(0, 1), (1, 0)}


def test_waitfor_picture_labels_legend_and_nothing_clipped():
    """Two ranks waiting on each other: both edge labels (op, sequence, group) readable apart,
    a legend naming the deadlock core, no artist clipped to the axes."""
    s, r = _run("unshadowed_logging")
    wf = build_waitfor(r, s)
    fig = waitfor_figure(wf, "t")
    fig.canvas.draw()
    ax = fig.axes[0]
    labels = [t for t in ax.texts if "all_reduce #18 on WORLD" in t.get_text()]
    assert len(labels) == 2 and all("(mismatch)" in t.get_text() for t in labels)
    a, b = (t.get_window_extent() for t in labels)
    assert not a.overlaps(b)  # edges both ways: their labels do not cover each other
    legend = ax.get_legend()
    assert legend is not None and any("deadlock core" in t.get_text() for t in legend.get_texts())
    assert all(not t.get_clip_on() for t in ax.texts)
    assert all(not c.get_clip_on() for c in ax.collections if c.get_offsets().shape[0] == len(wf.graph))


@pytest.mark.filterwarnings("ignore::DeprecationWarning")  # pydot's DOT parser, read here only to check the file
def test_waitfor_dot_names_op_group_and_sequence(tmp_path):
    import pydot

    s, r = _run("no_join_hang")
    wf = build_waitfor(r, s)
    p = write_graph(wf, tmp_path / "wf.dot", "no_join_hang")
    (g,) = pydot.graph_from_dot_data(p.read_text())
    (e,) = g.get_edges()
    assert (e.get_source(), e.get_destination()) == ("1", "0")
    assert e.get("op") == '"all_reduce"' and e.get("seq") == "11" and e.get("group") == "WORLD"
    assert "all_reduce #11 on WORLD" in e.get("label")
    roles = {n.get_name(): n.get("role") for n in g.get_nodes() if n.get_name() in ("0", "1")}
    assert roles == {"0": "culprit", "1": "root"}  # no deadlock core for a lone waiting rank
    assert to_dot(wf, "no_join_hang") == p.read_text()


def test_check_cli_json_and_graph(tmp_path):
    png = tmp_path / "g.png"
    p = run_cli("check", "scenarios/zero_before_ddp.toml", "--json", "--graph", str(png))
    assert p.returncode == 0, p.stderr  # the failure is what its [expect] says: the scenario passes
    d = json.loads(p.stdout)
    assert d["verdict"]["failed"] and d["passed"] and d["judged_by"] == "expect"
    assert d["verdict"]["kind"] == "size_mismatch" and d["verdict"]["waitfor"]["core"] == [[0, 1]]
    assert d["waitfor_dot"].startswith("strict digraph")
    assert any("ZeRO listed before DDP" in x for x in d["explanation"])
    assert png.exists()
    p = run_cli("check", "scenarios/ddp_join_uneven.toml")
    assert p.returncode == 0
    p = run_cli("run", "scenarios/no_join_hang.toml", "--json")
    d = json.loads(p.stdout)
    assert any(f["kind"] == "hang" for f in d["findings"]) and any("waits in" in n for n in d["notes"])


# --- hints name the fix of the failure's own family (issue 12) ---------------------------------
def test_a_rank_that_breaks_out_early_gets_the_stop_flag_fix_not_join():
    """Rank 0 is given 6 inputs like rank 1 but leaves its loop after 5 (a break on a condition):
    the fix is an all-reduced stop flag; Join would let rank 1 train on alone."""
    loop = [{"kind": "forward"}, {"kind": "backward"}]
    base = {"world_size": 2, "on_finish": "stay", "model": {"params": [[1, 1], [1]]}, "loop": loop}
    ran = parse_scenario({**base, "name": "ran", "inputs": {"counts": [5, 6]}})
    given = parse_scenario({**base, "name": "given", "inputs": {"counts": [6, 6]}})
    report = simulate(ran)  # what the ranks did: rank 0 finished its loop after 5 inputs
    v = check_run(report, given)
    text = "\n".join(explain_report(report, given))
    assert v.failed and "hint (a rank left its loop early): rank 0 stopped after 5 of its 6 inputs" in text
    assert "all-reduce a stop flag" in text and "Join is not the fix" in text
    assert "wrap the loop in Join" not in text


def test_uneven_raw_collectives_get_a_flag_or_equal_inputs_not_join():
    s = parse_scenario({"name": "raw", "world_size": 2, "on_finish": "stay", "inputs": {"counts": [1, 2]},
                        "loop": [{"kind": "collective", "op": "all_reduce"}]})
    text = "\n".join(explain_report(simulate(s), s))
    assert "hint (uneven inputs, raw collective)" in text and "'has data' flag" in text
    assert "wrap the loop in Join" not in text  # Join shadows no raw collective


def test_every_family_hint_names_a_fix():
    families = {"no_join_hang": "wrap the loop in Join", "join_disabled_uneven": "enable=True",
                "zero_before_ddp": "list the model before the optimizer",
                "subset_collective": "issue it on every member", "forward_collective_syncbn": "same number of inputs",
                "unshadowed_logging": "join hook shadows it", "ddp_zero_throw": "intended fail-fast"}
    for name, fix in families.items():
        s, r = _run(name)
        hints = [x for x in explain_report(r, s) if x.startswith("hint")]
        assert hints and any(fix in h for h in hints), (name, hints)
    s, r = _run("forward_collective_throw")  # already fails fast: the hint does not suggest the flag it has
    assert not any("pass throw_on_early_termination" in h for h in explain_report(r, s))


def _entries(*origins: str) -> list:
    from simdist.report import TraceEntry

    return [TraceEntry(seq=i + 1, op="all_reduce", numel=1, dtype="float32", group="WORLD", group_size=2, origin=o)
            for i, o in enumerate(origins)]


def test_trace_hints_tell_a_training_ranks_heartbeat_from_a_joined_ranks_shadow():
    """Join's heartbeat comes from a rank that is still training (DDP's forward) unless its rank
    already entered Join.__exit__: against a gradient all-reduce it means the ranks disagree on
    which iterations synchronise (no_sync), not that a rank ran out of inputs."""
    from simdist.check.classify import judge
    from simdist.check.trace_hints import trace_hints
    from simdist.report import Finding, RankResult, Report

    bwd, beat, count = "ddp.backward.bucket_allreduce", "join.notify_join_context.heartbeat", "join.exit.count_nonjoined"

    def hints(t0: list, t1: list) -> list[str]:
        ranks = [RankResult(0, "aborted", 0, trace=t0), RankResult(1, "error", 0, trace=t1)]
        rep = Report("s", "sim", "error", ranks, findings=[Finding("size_mismatch", "WORLD", 3, [0, 1], "x")],
                     world_size=2)
        return trace_hints(rep, judge(rep, list(rep.findings)))

    (h,) = hints(_entries(beat, bwd, bwd), _entries(beat, bwd, beat))  # rank 1 skipped a sync: no_sync
    assert h.startswith("hint (gradient synchronisation out of step): rank 0 is in DDP reducer") and "no_sync()" in h
    fwd = "ddp.pre_forward.sync_buffers"  # rank 1 had fewer inputs and went on to an evaluation forward
    (h2,) = hints(_entries(fwd, bwd, bwd), _entries(fwd, bwd, fwd))
    assert h2.startswith("hint (gradient synchronisation out of step)") and "ran out of inputs and went on" in h2
    (h,) = hints(_entries(beat, bwd, bwd), _entries(beat, count, beat))  # rank 1 joined: its ZeRO hook's step
    assert h.startswith("hint (Join's shadow out of step): rank 1 has run out of inputs")
