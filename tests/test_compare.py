"""simdist.compare: the sim-vs-real diff (pure; no processes)."""

from __future__ import annotations

import copy

from simdist.compare import compare_reports, format_comparison, values_equal
from simdist.report import RankError, RankResult, Report, TraceEntry


def _entry(seq: int, op: str = "all_reduce", numel: int = 1, origin: str = "user.loop[0]", **kw) -> TraceEntry:
    return TraceEntry(
        seq=seq, op=op, numel=numel, dtype=kw.pop("dtype", "float32"), group="WORLD", group_size=2, origin=origin, **kw
    )


def _report(source: str = "sim") -> Report:
    ranks = [
        RankResult(
            rank=0,
            status="completed",
            inputs_processed=2,
            observed={"sum": [1.0, 1.0]},
            trace=[_entry(1), _entry(2)],
            time=0.1,
        ),
        RankResult(
            rank=1,
            status="hang",
            inputs_processed=2,
            observed={"sum": [1.0, 1.0]},
            trace=[_entry(1), _entry(2), _entry(3)],
            blocked_in=_entry(3),
            time=0.2,
        ),
    ]
    return Report(scenario="t", source=source, outcome="hang", ranks=ranks, world_size=2)


def test_identical_reports_agree_even_with_different_timings():
    sim, real = _report("sim"), _report("real")
    for r in real.ranks:  # wall times, completion flags and t_issue are not compared
        r.time = 5.0
        for e in r.trace:
            e.t_issue, e.t_done, e.completed = 3.0, 3.1, True
    c = compare_reports(sim, real)
    assert c.agree
    assert c.differences == []
    assert [rc.agree for rc in c.ranks] == [True, True]
    assert "agree" in format_comparison(c).splitlines()[0]


def test_first_diverging_collective_is_reported_with_both_sides():
    sim, real = _report(), _report("real")
    real.ranks[1].trace[1] = _entry(2, op="broadcast", numel=3, dtype="int32", origin="ddp.pre_forward.rebuild_buckets")
    real.ranks[1].trace.append(_entry(4))
    c = compare_reports(sim, real)
    assert not c.agree
    (d,) = c.differences
    assert (d.field, d.rank, d.index) == ("trace", 1, 1)
    assert d.sim["op"] == "all_reduce" and d.real["op"] == "broadcast"
    assert d.real["origin"] == "ddp.pre_forward.rebuild_buckets" and d.real["dtype"] == "int32"
    text = format_comparison(c)
    assert "DIFFER" in text and "#2" in text and "rebuild_buckets" in text


def test_shorter_trace_diverges_at_its_end():
    sim, real = _report(), _report("real")
    del real.ranks[0].trace[1]
    c = compare_reports(sim, real)
    (d,) = c.differences
    assert d.index == 1 and d.real is None and d.sim["seq"] == 2
    assert "the trace ends here" in format_comparison(c)


def test_status_inputs_outcome_and_blocked_in():
    sim, real = _report(), _report("real")
    real.ranks[1].blocked_in = _entry(3, origin="user.other")
    real.ranks[0].inputs_processed = 1
    c = compare_reports(sim, real)
    assert {(d.field, d.rank) for d in c.differences} == {("blocked_in", 1), ("inputs_processed", 0)}
    real2 = _report("real")
    real2.ranks[1].status = "error"
    real2.outcome = "error"
    c2 = compare_reports(sim, real2)
    assert {(d.field, d.rank) for d in c2.differences} == {("outcome", None), ("status", 1)}


def test_errors_compare_category_and_python_messages_normalised():
    sim, real = _report(), _report("real")
    sim.ranks[0].error = RankError("RuntimeError", "Rank 0 exhausted all inputs.", "join_early_termination")
    real.ranks[0].error = RankError("RuntimeError", "Rank 0 exhausted all inputs.\nmore text", "join_early_termination")
    # Backend errors: only the category (addresses and ports differ).
    sim.ranks[1].error = RankError("RuntimeError", "Connection closed by peer", "peer_lost")
    real.ranks[1].error = RankError(
        "RuntimeError", "[pair.cc:553] Connection reset by peer [127.0.0.1]:1234", "peer_lost"
    )
    assert compare_reports(sim, real).agree
    real.ranks[0].error = RankError(
        "RuntimeError", "Detected at least one rank that exhausted inputs.", "join_early_termination"
    )
    c = compare_reports(sim, real)
    (d,) = c.differences
    assert d.field == "error" and d.rank == 0
    real.ranks[0].error = RankError("RuntimeError", "Rank 0 exhausted all inputs.", "join_early_termination")
    real.ranks[1].error = RankError("RuntimeError", "Timed out waiting 1000ms", "timeout")
    (d,) = compare_reports(sim, real).differences
    assert d.field == "error" and d.rank == 1 and d.sim == {"category": "peer_lost"}


def test_observed_values_tolerance_and_shapes():
    assert values_equal(1.0, 1)
    assert values_equal(10.0, 10.0 + 1e-9)
    assert not values_equal(10.0, 10.1)
    assert values_equal([0.0, 1.0], [0, 1])
    assert not values_equal([0.0, 1.0], [0.0])
    assert not values_equal(None, 0.0)
    assert values_equal(None, None)
    assert values_equal(True, 1)
    sim, real = _report(), _report("real")
    real.ranks[0].observed = {"sum": [1.0, 2.0], "extra": 3}
    c = compare_reports(sim, real)
    names = sorted(d.detail.split(":")[0] for d in c.differences)
    assert names == ["observed extra", "observed sum"]


def test_missing_rank_and_to_dict():
    sim, real = _report(), copy.deepcopy(_report("real"))
    real.ranks = real.ranks[:1]
    c = compare_reports(sim, real)
    assert not c.agree
    assert any(d.field == "ranks" and d.rank == 1 for d in c.differences)
    d = c.to_dict()
    assert d["agree"] is False and d["ranks"][0]["agree"] is True


def test_aborted_rank_trace_may_continue_past_the_sim_on_real_only():
    from simdist.compare import compare_reports
    from simdist.report import RankError, RankResult, Report, TraceEntry

    def entry(seq):
        return TraceEntry(seq, "broadcast", 4, "float32", "WORLD", 2, "zero.join_hook.broadcast_shard")

    err = RankError("gloo::EnforceNotMet", "op.preamble.length <= op.nbytes", "gloo_abort")

    def report(src, n, status="aborted"):
        return Report("s", src, "error", [RankResult(0, status, 0, err if status == "aborted" else None,
                                                     trace=[entry(i) for i in range(1, n + 1)])])

    # a race in the real process: extra async issues before SIGABRT lands
    assert compare_reports(report("sim", 5), report("real", 8)).agree
    # but never fewer, never different, and only for a rank aborted on both sides
    assert not compare_reports(report("sim", 8), report("real", 5)).agree
    assert not compare_reports(report("sim", 5, "error"), report("real", 8, "error")).agree


def test_printed_lines_first_difference_and_missing_lines():
    sim, real = _report(), _report("real")
    sim.ranks[0].output = ["epoch 0 loss 1.5", "epoch 1 loss 1.25"]
    real.ranks[0].output = ["epoch 0 loss 1.5", "epoch 1 loss 1.2500001"]
    sim.ranks[1].output = ["done"]
    real.ranks[1].output = []
    sim.ranks[1].stderr = ["a warning that only the simulator's process group gives"]
    c = compare_reports(sim, real)
    assert {(d.field, d.rank, d.index) for d in c.differences} == {("output", 0, 1), ("output", 1, 0)}
    d0 = next(d for d in c.differences if d.rank == 0)
    assert (d0.sim, d0.real) == ("epoch 1 loss 1.25", "epoch 1 loss 1.2500001")
    text = format_comparison(c)
    assert "printed line 2 differs" in text and "'epoch 1 loss 1.2500001'" in text
    assert "printed line 1 differs (sim 1, real 0 lines): sim 'done' | real (no such line)" in text
    real.ranks[0].output = list(sim.ranks[0].output)
    real.ranks[1].output = ["done"]
    assert compare_reports(sim, real).agree  # stderr is not compared


def test_peer_reduce_op_root_and_location_where_the_real_side_knows_them():
    from simdist.report import CodeLocation

    sim, real = _report(), _report("real")
    for rep in (sim, real):
        rep.ranks[0].trace.append(_entry(1, op="send", peer=1))
        rep.ranks[0].location = CodeLocation("/x/train.py", 12, "main")
    real.ranks[0].trace[-1].peer = 0
    (d,) = compare_reports(sim, real).differences
    assert (d.field, d.index) == ("trace", 2) and "peer=0" in format_comparison(compare_reports(sim, real))
    real.ranks[0].trace[-1].peer = 1
    sim.ranks[0].trace[0].reduce_op, real.ranks[0].trace[0].reduce_op = "sum", "max"
    sim.ranks[0].trace[1].root = 1  # the real side does not know it (None): not compared
    real.ranks[0].location = CodeLocation("/x/train.py", 14, "main")
    c = compare_reports(sim, real)
    assert {(d.field, d.rank, d.index) for d in c.differences} == {("reduce_op", 0, 0), ("location", 0, None)}
    assert "ended at: sim train.py:12 | real train.py:14" in format_comparison(c)


def test_a_real_rank_killed_before_it_could_record_has_no_trace_to_compare():
    sim, real = _report(), _report("real")
    for rep in (sim, real):
        rep.ranks[1].status, rep.ranks[1].blocked_in = "aborted", None
        rep.ranks[1].error = RankError("SIGABRT", "aborted", "gloo_abort")
        rep.outcome = "error"
    real.ranks[1].trace = []
    assert compare_reports(sim, real).agree
    real.ranks[1].status = "error"  # not aborted: what it recorded is compared
    assert {d.field for d in compare_reports(sim, real).differences} == {"status", "trace"}


def test_a_real_rank_killed_by_a_signal_before_it_reported_has_no_record_to_compare():
    """mp.spawn SIGTERMs the other workers once one raised: a real worker blocked in DDP's
    all_reduce may die before it reports its record (no trace, no line), as the simulated
    one, which the model knows, does not: its status, error category and printed lines are
    compared, its operations are not. One that reported is compared in full."""
    from simdist.report import CodeLocation

    sim, real = _report(), _report("real")
    for rep in (sim, real):
        rep.ranks[1].status, rep.ranks[1].blocked_in = "error", None
        rep.ranks[1].error = RankError("Killed", "the process ended without reporting how", "killed")
        rep.outcome = "error"
    sim.ranks[1].location = CodeLocation("/x/train.py", 12, "main")
    real.ranks[1].trace = []
    c = compare_reports(sim, real)
    assert c.agree and c.ranks[1].unrecorded and not c.ranks[0].unrecorded
    real.ranks[1].error = RankError("ValueError", "bad", "other")  # raised, not killed: compared
    assert {d.field for d in compare_reports(sim, real).differences} == {"error", "trace", "location"}
    real.ranks[1].error = RankError("Killed", "the process ended without reporting how", "killed")
    real.ranks[1].location = CodeLocation("/x/train.py", 14, "main")  # it reported where it was: compared
    assert {d.field for d in compare_reports(sim, real).differences} == {"trace", "location"}


def test_a_real_rank_the_watchdog_ended_in_a_hang_has_no_record_to_compare():
    """A script's real rank killed by the watchdog in a hang before it answered the request for
    its record keeps no Flight Recorder, line or blocked operation: its outcome, status and
    printed lines are compared, the rest is not (the run is not a difference for that), and
    the summary says so. (A rank that answered is compared in full: tests/test_script_hang.py.)"""
    from simdist.report import CodeLocation

    sim, real = _report(), _report("real")
    sim.ranks[1].location = CodeLocation("/x/train.py", 12, "main")
    real.ranks[1].trace, real.ranks[1].blocked_in = [], None
    c = compare_reports(sim, real)
    assert c.agree and c.ranks[1].unrecorded and not c.ranks[0].unrecorded
    assert "rank 1: agree (3 sim / 0 real collectives; the real rank was ended with no record" \
        in format_comparison(c)
    sim.ranks[1].output, real.ranks[1].output = ["step 1"], ["step 2"]  # still compared
    assert {d.field for d in compare_reports(sim, real).differences} == {"output"}
    real.ranks[1].location = CodeLocation("/x/train.py", 14, "main")  # it recorded where it was: compared
    assert {d.field for d in compare_reports(sim, real).differences} == {"output", "trace", "location", "blocked_in"}
