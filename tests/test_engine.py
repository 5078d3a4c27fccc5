"""The engine: matching by issue order, value semantics, async handles, groups, p2p, hangs."""

from __future__ import annotations

import pytest

from simdist.engine.core import Engine
from simdist.engine.values import Payload
from simdist.scenario import parse_scenario
from simdist.sim import AlphaBeta, simulate


def sim(d: dict):
    return simulate(parse_scenario(d))


def one_collective(world: int, **step) -> object:
    return sim({"world_size": world, "inputs": {"counts": [1] * world},
                "loop": [{"kind": "collective", "observe": "out", **step}]})


@pytest.mark.parametrize(
    "op,values,expected",
    [
        ("sum", [1, 2, 3], 6),
        ("avg", [1, 2, 3], 2),
        ("product", [2, 3, 4], 24),
        ("min", [5, 2, 7], 2),
        ("max", [5, 2, 7], 7),
        ("band", [6, 3, 7], 2),
        ("bor", [1, 2, 4], 7),
        ("bxor", [1, 3, 7], 5),
    ],
)
def test_reduce_op_values(op, values, expected):
    dtype = "int64" if op in ("band", "bor", "bxor") else "float32"
    # value "rank" gives 0, 1, 2: map to the wanted inputs via a per-rank step each
    steps = [
        {"kind": "collective", "op": "all_reduce", "reduce_op": op, "dtype": dtype, "value": v, "ranks": [r],
         "observe": "out"}
        for r, v in enumerate(values)
    ]
    rep = sim({"world_size": 3, "inputs": {"counts": [1, 1, 1]}, "loop": steps})
    assert rep.outcome == "completed"
    assert [r.observed["out"] for r in rep.ranks] == [[expected]] * 3


def test_collectives_pair_by_issue_order_not_meaning():
    # rank 0 issues all_reduce(rank) then all_reduce(10); rank 1 issues them the other way round.
    steps = [
        {"kind": "collective", "op": "all_reduce", "value": "rank", "ranks": [0], "observe": "a"},
        {"kind": "collective", "op": "all_reduce", "value": 10, "ranks": [0, 1], "observe": "b"},
        {"kind": "collective", "op": "all_reduce", "value": "rank", "ranks": [1], "observe": "a"},
    ]
    rep = sim({"world_size": 2, "inputs": {"counts": [1, 1]}, "loop": steps})
    assert rep.outcome == "completed"
    # first collective of each rank pairs: 0 (rank 0's rank) + 10 = 10
    assert rep.ranks[0].observed == {"a": [10.0], "b": [11.0]}
    assert rep.ranks[1].observed == {"b": [10.0], "a": [11.0]}
    assert [e.seq for e in rep.ranks[0].trace] == [1, 2]


def test_broadcast_gather_scatter_values():
    rep = one_collective(3, op="broadcast", root=2, value="rank")
    assert [r.observed["out"] for r in rep.ranks] == [[2.0]] * 3
    rep = one_collective(3, op="all_gather", value="rank", numel=2)
    assert rep.ranks[1].observed["out"] == [[0.0, 0.0, 1.0, 1.0, 2.0, 2.0]]
    rep = one_collective(2, op="reduce_scatter", value="rank", numel=4)
    assert [r.observed["out"] for r in rep.ranks] == [[[1.0, 1.0]], [[1.0, 1.0]]]
    rep = one_collective(3, op="reduce", root=1, value=2)
    # Gloo's ring reduce works in place: a non-root keeps the partial sums that passed through
    # it (rank 0 the whole sum of its block, rank 2 only its own value; see values.reduce_partial)
    assert [r.observed["out"] for r in rep.ranks] == [[6.0], [6.0], [2.0]]


def test_async_handle_waited_at_end_of_iteration():
    rep = sim({"world_size": 2, "inputs": {"counts": [2, 2]}, "loop": [
        {"kind": "collective", "op": "all_reduce", "async": True, "wait": "end_of_iteration", "value": "iteration",
         "observe": "it"},
        {"kind": "compute", "seconds": 0.5},
    ]})
    assert rep.outcome == "completed"
    assert rep.ranks[0].observed["it"] == [0.0, 2.0]
    # the compute overlapped the async collective: each iteration takes ~0.5 s, not 0.5 + comm
    assert rep.ranks[0].time == pytest.approx(1.0, rel=1e-3)
    assert all(e.async_op for e in rep.ranks[0].trace)


def test_async_work_handle_api():
    eng = Engine(2, {"WORLD": [0, 1]}, AlphaBeta(alpha=1.0, beta=0.0))
    got = {}

    def prog(r):
        w = eng.issue(r, "all_reduce", Payload.full(1, "float32", r + 1), origin="t", reduce_op="sum", async_op=True)
        assert not w.done
        res = yield from w.wait()
        got[r] = (res.item(), eng.env.now)

    for r in range(2):
        eng.env.process(prog(r))
    eng.env.run()
    assert got == {0: (3.0, 2.0), 1: (3.0, 2.0)}  # 2(p-1) alpha = 2 s


def test_subgroups_have_their_own_sequence_numbers():
    rep = sim({
        "world_size": 4, "inputs": {"counts": [1, 1, 1, 1]},
        "groups": [{"name": "evens", "ranks": [0, 2]}, {"name": "odds", "ranks": [1, 3]}],
        "loop": [
            {"kind": "collective", "op": "all_reduce", "group": "evens", "ranks": [0, 2], "value": "rank",
             "observe": "g"},
            {"kind": "collective", "op": "all_reduce", "group": "odds", "ranks": [1, 3], "value": "rank",
             "observe": "g"},
            {"kind": "collective", "op": "all_reduce", "value": 1, "observe": "w"},
        ],
    })
    assert rep.outcome == "completed"
    assert [r.observed["g"] for r in rep.ranks] == [[2.0], [4.0], [2.0], [4.0]]
    assert [(e.group, e.seq, e.group_size) for e in rep.ranks[1].trace] == [("odds", 1, 2), ("WORLD", 1, 4)]


def test_p2p_matches_by_src_dst_tag_in_order():
    rep = sim({"world_size": 3, "inputs": {"counts": [2, 2, 2]}, "loop": [
        {"kind": "p2p", "src": 0, "dst": 2, "tag": 1, "value": "iteration", "observe": "from0"},
        {"kind": "p2p", "src": 1, "dst": 2, "tag": 1, "value": 7, "observe": "from1"},
    ]})
    assert rep.outcome == "completed"
    assert rep.ranks[2].observed == {"from0": [0.0, 1.0], "from1": [7.0, 7.0]}
    assert [(e.op, e.peer) for e in rep.ranks[0].trace] == [("send", 2), ("send", 2)]


def test_p2p_without_partner_hangs():
    rep = sim({"world_size": 2, "inputs": {"counts": [1, 1]}, "on_finish": "stay",
               "loop": [{"kind": "p2p", "src": 0, "dst": 1, "ranks": [0]}]})
    assert rep.outcome == "hang"
    assert rep.ranks[0].status == "hang" and rep.ranks[0].blocked_in.op == "send"
    assert rep.ranks[1].status == "completed"


def test_three_collective_kinds_and_a_rank_elsewhere_hang_without_a_crash():
    """Ranks 0-2 post a barrier, an all_gather and an all_reduce at one position while rank 3
    waits in a recv: the stand-in for the absent rank must not run out of kinds (it raised
    StopIteration, an internal error) and every rank is left waiting."""
    loop = [{"kind": "collective", "op": op, "ranks": [r]}
            for r, op in enumerate(("barrier", "all_gather", "all_reduce"))]
    loop.append({"kind": "p2p", "src": 0, "dst": 3, "ranks": [3]})
    rep = sim({"world_size": 4, "inputs": {"counts": [1] * 4}, "on_finish": "stay", "loop": loop})
    assert rep.outcome == "hang"
    assert [r.status for r in rep.ranks] == ["hang"] * 4
    assert [r.blocked_in.op for r in rep.ranks] == ["barrier", "all_gather", "all_reduce", "recv"]


def test_hang_reports_blocked_ranks_and_collective():
    rep = sim({"world_size": 3, "inputs": {"counts": [1, 2, 2]}, "on_finish": "stay",
               "loop": [{"kind": "collective", "op": "all_reduce", "name": "step_sync"}]})
    assert rep.outcome == "hang"
    assert [r.status for r in rep.ranks] == ["completed", "hang", "hang"]
    for r in rep.ranks[1:]:
        assert r.blocked_in is not None and r.blocked_in.seq == 2 and r.blocked_in.origin == "user.step_sync"
        assert r.inputs_processed == 1


def test_exited_peer_fails_pending_collective_at_once():
    rep = sim({"world_size": 2, "inputs": {"counts": [1, 2]}, "on_finish": "exit",
               "loop": [{"kind": "collective", "op": "all_reduce"}]})
    assert rep.outcome == "error"
    assert rep.ranks[1].status == "error" and rep.ranks[1].error.category == "peer_lost"


def test_large_payloads_carry_no_values_but_uniform_fill_survives():
    rep = one_collective(2, op="all_reduce", numel=1000, value=1.5)
    assert rep.ranks[0].observed["out"] == [None]
    assert rep.ranks[0].trace[0].numel == 1000


def test_simulated_time_uses_cost_model():
    s = parse_scenario({"world_size": 2, "inputs": {"counts": [1, 1]},
                        "loop": [{"kind": "collective", "op": "all_reduce", "numel": 1000}]})
    rep = simulate(s, cost=AlphaBeta(alpha=1e-3, beta=1e-6))
    # 2(p-1) alpha + 2(p-1)/p n beta = 2e-3 + 4000 B * 1e-6
    assert rep.ranks[0].time == pytest.approx(2e-3 + 4000e-6)


def test_non_member_skips_group_collective_with_torch_warning():
    rep = sim({"world_size": 3, "inputs": {"counts": [1, 1, 1]}, "groups": [{"name": "g", "ranks": [0, 1]}],
               "loop": [{"kind": "collective", "op": "all_reduce", "group": "g", "value": 1, "observe": "x"}]})
    assert rep.outcome == "completed"
    assert rep.ranks[2].trace == [] and "x" not in rep.ranks[2].observed
    assert "does not belong to the given group" in rep.ranks[2].warnings[0]
    assert rep.ranks[0].observed["x"] == [2.0]


def test_abort_lets_the_rank_whose_messages_matched_complete():
    # int64[1] (8 B) against float32[1] (4 B): the float rank aborts, the int64 rank completes (real Gloo)
    rep = sim({"world_size": 2, "inputs": {"counts": [1, 1]}, "loop": [
        {"kind": "collective", "op": "all_reduce", "dtype": "int64", "ranks": [0]},
        {"kind": "collective", "op": "all_reduce", "dtype": "float32", "ranks": [1]}]})
    assert [r.status for r in rep.ranks] == ["completed", "aborted"]
    assert rep.ranks[1].error.category == "gloo_abort"
    assert rep.findings[0].kind == "dtype_mismatch"


def test_half_completed_size_mismatch_has_unknown_values():
    # 1 vs 4 floats: on Gloo the smaller rank completes with wrong values, the larger blocks
    rep = sim({"world_size": 2, "inputs": {"counts": [1, 1]}, "on_finish": "stay", "loop": [
        {"kind": "collective", "op": "all_reduce", "numel": 1, "ranks": [0], "observe": "x"},
        {"kind": "collective", "op": "all_reduce", "numel": 4, "ranks": [1], "observe": "x"}]})
    assert rep.outcome == "hang"
    assert rep.findings and rep.findings[0].kind == "size_mismatch"


def test_broadcast_rank_fed_by_root_completes_though_a_sibling_never_posts():
    # Gloo's binomial broadcast, 4 ranks, root 0: rank 2 receives from the root and finishes
    # even though rank 1 (alive, done with its loop) never posts; ranks 0 and 3 block.
    rep = sim({"world_size": 4, "inputs": {"counts": [1, 0, 1, 1]}, "on_finish": "stay", "loop": [
        {"kind": "collective", "op": "broadcast", "root": 0, "value": 7, "observe": "b"},
        {"kind": "collective", "op": "all_reduce", "name": "next"}]})
    assert [r.status for r in rep.ranks] == ["hang", "completed", "hang", "hang"]
    assert rep.ranks[2].observed["b"] == [7.0]
    assert rep.ranks[2].blocked_in.origin == "user.next"
    assert rep.ranks[0].blocked_in.op == rep.ranks[3].blocked_in.op == "broadcast"


def test_recv_from_any_source_takes_the_waiting_sender_or_the_next_one():
    eng = Engine(3, {"WORLD": [0, 1, 2]}, AlphaBeta(alpha=1.0, beta=0.0))
    sent = {r: eng.p2p(r, "send", Payload.full(2, "float32", r), 0, tag=0, origin="t") for r in (2, 1)}
    first = eng.p2p(0, "recv", Payload.unknown(2, "float32"), None, tag=0, origin="t")
    second = eng.p2p(0, "recv", Payload.unknown(2, "float32"), None, tag=0, origin="t")
    later = eng.p2p(0, "recv", Payload.unknown(2, "float32"), None, tag=0, origin="t")
    eng.env.run()
    # both messages were waiting: the lowest sender first (gloo looks through its pairs in order)
    assert (first.call.entry.peer, first.call.event.value.item()) == (1, 1.0)
    assert (second.call.entry.peer, second.call.event.value.item()) == (2, 2.0)
    assert all(w.done for w in sent.values()) and not later.done and later.call.entry.peer is None
    eng.p2p(2, "send", Payload.full(2, "float32", 7), 0, tag=0, origin="t")  # a later send meets the waiting recv
    eng.env.run()
    assert (later.call.entry.peer, later.call.event.value.item()) == (2, 7.0)


@pytest.mark.parametrize("side_first", [True, False])
def test_p2p_never_pairs_across_groups(side_first):
    # Each group is a Gloo context with its own pairs: rank 1's irecv on a side group [0, 1]
    # stays pending while rank 0's WORLD send meets rank 1's WORLD recv, in whichever order
    # rank 1's two receives were posted (tests/scripts/thread_wait_times_out.py: a thread's
    # side-group irecv posted before the main thread's recv took the WORLD send, a 4-byte
    # receive of 8 bytes, on some runs only)
    eng = Engine(2, {"WORLD": [0, 1], "side": [0, 1]}, AlphaBeta(alpha=1.0, beta=0.0))
    recv = {}
    for g in ("side", "WORLD") if side_first else ("WORLD", "side"):
        n = 1 if g == "side" else 2
        recv[g] = eng.p2p(1, "recv", Payload.unknown(n, "float32"), 0, tag=0, origin="t", group=g)
    any_side = eng.p2p(1, "recv", Payload.unknown(2, "float32"), None, tag=0, origin="t", group="side")
    sent = eng.p2p(0, "send", Payload.full(2, "float32", 5), 1, tag=0, origin="t", group="WORLD")
    eng.env.run()
    assert eng.findings == []
    assert sent.done and recv["WORLD"].done and recv["WORLD"].call.event.value.item() == 5.0
    assert not recv["side"].done and not any_side.done and any_side.call.entry.peer is None
    eng.p2p(0, "send", Payload.full(1, "float32", 3), 1, tag=0, origin="t", group="side")
    eng.env.run()
    assert recv["side"].done and recv["side"].call.event.value.item() == 3.0 and not any_side.done


@pytest.mark.parametrize("op,dtype,name", [("all_reduce", "int64", "Long"), ("reduce", "int32", "Int"),
                                           ("reduce_scatter", "bool", "Bool")])
def test_integer_avg_raises_gloos_error_on_every_rank(op, dtype, name):
    # Gloo's AVG is SUM then an in-place division an integer tensor cannot hold: every rank
    # raises at wait() (root or not), the collective itself ran (the next one pairs); real
    # Gloo's run of the same scenario agrees (simdist compare; tests/scripts/int_avg.py)
    rep = sim({"world_size": 3, "inputs": {"counts": [1] * 3}, "loop": [
        {"kind": "collective", "op": op, "numel": 3, "dtype": dtype, "reduce_op": "avg", "root": 1,
         "async": True, "wait": "never"},
        {"kind": "collective", "op": "all_reduce", "value": "rank", "observe": "out"},
        {"kind": "collective", "op": op, "numel": 3, "dtype": dtype, "reduce_op": "avg", "root": 1}]})
    assert [r.status for r in rep.ranks] == ["error"] * 3
    assert {r.error.message for r in rep.ranks} == {f"result type Float can't be cast to the desired output type {name}"}
    assert [r.observed["out"] for r in rep.ranks] == [[3.0]] * 3
    assert [len(r.trace) for r in rep.ranks] == [3] * 3


def test_mismatched_sizes_give_the_bytes_gloos_ring_gives():
    """A script's all_reduce where rank 1 sends 5 floats and ranks 0 and 2 send 4: Gloo pairs
    them, ranks 0 and 2 finish with what its byte-level ring leaves (gloo_rules.mixed_result),
    not their own tensors. Measured on real Gloo with tests/scripts/rank_failures.py
    --case mismatch (3 ranks), which prints the whole summed tensor: ranks 0 and 2 both print
    "summed [1.0, 4.0, 3.0, 4.0]" (test_script_examples checks the script run against it)."""
    import numpy as np

    eng = Engine(3, {"WORLD": [0, 1, 2]}, AlphaBeta(0.0, 0.0))
    ins = {0: [1.0] * 4, 1: [0.0] * 5, 2: [3.0] * 4}
    works = {r: eng.issue(r, "all_reduce", Payload.from_array(np.array(v, dtype=np.float32), "float32", exact=True),
                          origin="user", reduce_op="sum") for r, v in ins.items()}
    eng.env.run()
    assert works[0].done and works[2].done and not works[1].done  # rank 1 waits for a message never sent
    assert [works[r].call.value.array().tolist() for r in (0, 2)] == [[1.0, 4.0, 3.0, 4.0]] * 2


def test_a_group_made_after_the_engine_pairs_and_fails_like_one_made_before():
    """A script creates process groups as it runs (`new_group`): the engine learns them then
    (`add_group`), and issuing on one, or a member exiting, works as for a group it started with."""
    eng = Engine(3, {"WORLD": [0, 1, 2]}, AlphaBeta(0.0, 0.0))
    assert eng.add_group("pg1", [2, 0]) == [2, 0]  # group-rank order (new_group's sort_ranks=False)
    assert eng.add_group("pg1", [0, 1]) == [2, 0]  # an existing name keeps its members
    works = [eng.issue(r, "all_reduce", Payload.full(1, "float32", r + 1), group="pg1", origin="user",
                       reduce_op="sum") for r in (0, 2)]
    eng.env.run()
    assert [w.call.value.item() for w in works] == [4.0, 4.0]
    assert [w.call.entry.seq for w in works] == [1, 1]
    eng.rank_gone(2, abrupt=True)  # a dead member fails the next collective on the group
    late = eng.issue(0, "all_reduce", Payload.full(1, "float32", 1), group="pg1", origin="user", reduce_op="sum")
    eng.env.run()
    assert late.done and late.call.ok is False


@pytest.mark.parametrize("op,local", [("all_reduce", True), ("all_gather", True), ("reduce", True),
                                      ("broadcast", False), ("gather", False)])
def test_an_empty_collective_is_local_on_gloo_for_the_ops_gloo_skips(op, local):
    """Gloo returns at once from an all_reduce, reduce or all_gather of zero elements: a rank
    that calls one alone completes it (it still takes the group's next sequence number, so the
    ranks fall out of step and the next collective hangs, as real Gloo's times out); a
    broadcast or gather of zero elements waits for the peers (measured, torch 2.13)."""
    steps = [{"kind": "collective", "op": op, "numel": 0, "ranks": [0]},
             {"kind": "collective", "op": "all_reduce", "numel": 1}]
    rep = sim({"world_size": 2, "backend": "gloo", "inputs": {"counts": [1, 1]}, "loop": steps})
    assert rep.outcome == "hang"
    assert [len(r.trace) for r in rep.ranks] == ([2, 1] if local else [1, 1])
    assert rep.ranks[0].trace[0].completed is local


def test_differing_posts_abort_before_a_member_that_never_posts():
    # 3 ranks, rank 0 never posts (done, staying alive); ranks 1 and 2 all_reduce 6 float32 and
    # 15 int32: Gloo's ring sends rank 2's 12-byte segment into rank 1's 4-byte receive without
    # rank 0 (tests/scripts/reduce_scatter_two_sizes.py on real Gloo): rank 1 aborts at once;
    # rank 2 waits for rank 0's segment (a hang, not a failure from rank 1's death)
    rep = sim({"world_size": 3, "inputs": {"counts": [0, 1, 1]}, "on_finish": "stay", "loop": [
        {"kind": "collective", "op": "all_reduce", "numel": 6, "dtype": "float32", "ranks": [1]},
        {"kind": "collective", "op": "all_reduce", "numel": 15, "dtype": "int32", "ranks": [2]}]})
    assert rep.ranks[1].status == "aborted" and rep.ranks[1].error.category == "gloo_abort"
    assert "12 bytes from rank 2 into a 4-byte receive" in rep.ranks[1].error.message
    assert [r.status for r in rep.ranks] == ["completed", "aborted", "hang"]
    assert rep.findings[0].kind == "size_mismatch" and rep.findings[0].ranks == [1, 2]


def test_an_abort_before_the_last_member_posts_leaves_the_ranks_whose_messages_went_through():
    # broadcast from rank 0 over 4 ranks (tree 0->1, 0->2, 1->3): ranks 0 and 2 post 300
    # float32, then rank 1 posts 2 (the root's message aborts it), then rank 3 (fed by rank 1).
    # The root wrote both its messages and rank 2 got its own: both complete; only rank 3, whose
    # sender died, fails (this scenario and a script of its shape under `simdist compare`: real Gloo, torch
    # 2.13, gives the same four outcomes; the engine had failed 0 and 2 with the reset)
    steps = [{"kind": "sleep", "seconds": [0, 0.1, 0, 0.2]},
             {"kind": "collective", "op": "broadcast", "numel": 300, "ranks": [0, 2, 3]},
             {"kind": "collective", "op": "broadcast", "numel": 2, "ranks": [1]}]
    rep = sim({"world_size": 4, "inputs": {"counts": [1, 1, 1, 1]}, "loop": steps})
    assert [r.status for r in rep.ranks] == ["completed", "aborted", "completed", "error"]
    assert rep.ranks[3].error.message == "Connection reset by peer (rank 1 has exited)"


def test_a_collective_an_abort_cut_off_fails_its_late_poster_at_once():
    # rank 1's async all_reduce is in flight when rank 0's 10-element message kills it in a
    # 1-element receive; rank 0 posts the all_reduce afterwards: its ring send meets the reset
    # socket at once (real Gloo, torch 2.13, a script of this shape), not its timeout
    steps = [{"kind": "collective", "op": "all_reduce", "async": True, "wait": "end_of_iteration", "ranks": [1]},
             {"kind": "p2p", "src": 0, "dst": 1, "numel": 10, "ranks": [0]},
             {"kind": "p2p", "src": 0, "dst": 1, "numel": 1, "ranks": [1]},
             {"kind": "sleep", "seconds": 0.3, "ranks": [0]},
             {"kind": "collective", "op": "all_reduce", "ranks": [0]}]
    rep = sim({"world_size": 2, "inputs": {"counts": [1, 1]}, "loop": steps})
    assert [r.status for r in rep.ranks] == ["error", "aborted"]
    assert rep.ranks[0].error.message == "Connection reset by peer (rank 1 has exited)"


def test_issues_test_before_gloo_local_error_passes_over_no_call_that_fails():
    """`Engine.issue` asks `gloo_local_error` only for a reduce op Gloo may refuse, a dtype
    without a Gloo kernel or an all_to_all (the hot path's shortcut): every call it passes over
    must be one that function lets through, whatever op, dtype and reduce op (PREMUL_SUM too),
    so a case added there is not hidden."""
    from types import SimpleNamespace

    from simdist.engine.results import gloo_local_error
    from simdist.vocab import DTYPE_BYTES, GLOO_LOCAL_REDUCE_OPS, GLOO_NO_KERNEL_DTYPES, OPS, PREMUL_SUM, REDUCE_OPS

    for op in OPS:
        for dtype in DTYPE_BYTES:
            for red in (None, *REDUCE_OPS, PREMUL_SUM):
                if red in GLOO_LOCAL_REDUCE_OPS or dtype in GLOO_NO_KERNEL_DTYPES or op == "all_to_all":
                    continue
                call = SimpleNamespace(op=op, reduce_op=red, payload=Payload(4, dtype))
                assert gloo_local_error(call) is None, (op, dtype, red)  # type: ignore[arg-type]


def test_payload_caches_keep_the_sign_of_zero_and_hit_for_nan():
    """The shared payloads are keyed on the fill's bits: -0.0 == 0.0, so keyed on the value
    a -0.0 fill once came back as the cached 0.0 (its sign is a value torch keeps: 1/x, copysign);
    nan != nan made every NaN fill a new cache entry."""
    import math

    for dtype in ("float32", "float64"):
        assert math.copysign(1.0, Payload.full(1, dtype, 0.0).fill) == 1.0
        assert math.copysign(1.0, Payload.full(1, dtype, -0.0).fill) == -1.0
        assert math.copysign(1.0, Payload.runs([(2, -0.0)], dtype).fill) == -1.0
        mixed = Payload.runs([(1, 0.0), (1, -0.0)], dtype)  # two runs, not one fill of the first's sign
        assert mixed.fill is None and [math.copysign(1.0, v) for _, v in mixed.segments] == [1.0, -1.0]
        nan = Payload.full(3, dtype, float("nan"))
        assert Payload.full(3, dtype, float("nan")) is nan and math.isnan(nan.fill)
        assert Payload.runs([(3, float("nan"))], dtype) is Payload.runs([(3, float("nan"))], dtype)


@pytest.mark.parametrize(("t_send", "sent"), [(0.5, True), (1.5, False)])
def test_a_send_posted_before_its_receiver_left_meets_the_receive_it_had_posted(t_send, sent):
    """Rank 1 posts a receive and its process ends at t = 1.0 (a script's coordinator hears of
    the send of rank 0, issued at `t_send` on the ranks' clocks, only after: a 64 MB message
    takes it long to read). Posted before the end, the send pairs with the receive (on Gloo
    the receiver's notice reached the sender while both were up) and completes, as with the
    messages read in the other order; posted after, it meets the closed socket. Before, the
    order the coordinator read them in decided (tests/scripts/send_to_leaver.py 67108864
    posted: 2 of 4 simulated runs lost the peer)."""
    eng = Engine(2, {"WORLD": [0, 1]}, AlphaBeta(alpha=0.0, beta=0.0))
    eng.p2p(1, "recv", Payload.unknown(2, "float32"), 0, tag=0, origin="t", t_issue=0.9)
    eng.rank_gone(1, at=1.0)
    work = eng.p2p(0, "send", Payload.full(2, "float32", 5), 1, tag=0, origin="t", t_issue=t_send)
    eng.env.run()
    assert work.done and work.call.ok is sent
    if not sent:
        assert work.call.value.error.message == "Connection closed by peer (rank 1 has exited)"


def test_a_send_posted_before_its_receiver_left_meets_its_receive_from_any_source():
    """The same with the receiver's `recv` from any source (`peer=None`): the send, posted
    before rank 1 ended and heard after, takes that receive as a named one does; before, it
    met the closed socket, and the order the messages were read in decided again."""
    eng = Engine(2, {"WORLD": [0, 1]}, AlphaBeta(alpha=0.0, beta=0.0))
    recv = eng.p2p(1, "recv", Payload.unknown(2, "float32"), None, tag=0, origin="t", t_issue=0.9)
    eng.rank_gone(1, at=1.0)
    work = eng.p2p(0, "send", Payload.full(2, "float32", 5), 1, tag=0, origin="t", t_issue=0.5)
    eng.env.run()
    assert work.done and work.call.ok and recv.call.entry.peer == 0


@pytest.mark.parametrize("send_first", [True, False])
def test_a_send_at_the_instant_its_receiver_ends_pairs_whichever_the_engine_hears_first(send_first):
    """A scenario's ranks (no `t_issue`: the engine's own clock): rank 1 posts a receive and
    ends at t = 0, rank 0 sends at t = 0. Posted no later than the end, the send pairs with the
    receive in either order of the two, as a script's does; before, the order decided."""
    eng = Engine(2, {"WORLD": [0, 1]}, AlphaBeta(alpha=0.0, beta=0.0))
    send = lambda: eng.p2p(0, "send", Payload.full(2, "float32", 5), 1, tag=0, origin="t")  # noqa: E731
    work = send() if send_first else None
    eng.p2p(1, "recv", Payload.unknown(2, "float32"), 0, tag=0, origin="t")
    eng.rank_gone(1)
    work = work or send()
    eng.env.run()
    assert work.done and work.call.ok


def test_a_finished_traces_mismatch_is_judged_in_the_groups_rank_order():
    """`check.pairing` judges a finished trace's mismatch (real Gloo's, a job's dumps) with
    Gloo's rules, which run rings over group ranks: on group [1, 0, 2] (sort_ranks=False) with
    group rank 0 all-reducing 8 elements and the others 6, real Gloo aborts rank 2 (measured:
    `simdist compare tests/scripts/unsorted_group.py --nproc-per-node 3 -- sizes`). Numbered
    ascending, the rules aborted rank 0."""
    from simdist.check.pairing import _consequence, trace_mismatches
    from simdist.engine.gloo_rules import CollectiveCall
    from simdist.report import RankResult, Report, TraceEntry
    from simdist.script.build import Groups

    def rank(r: int) -> RankResult:
        entry = TraceEntry(1, "all_reduce", 8 if r == 1 else 6, "float32", "g", 3, "user", reduce_op="sum")
        return RankResult(r, "error", trace=[entry])

    report = Report("t", "real", "error", [rank(r) for r in range(3)], world_size=3)
    [finding] = trace_mismatches(report, Groups({"WORLD": [0, 1, 2], "g": [1, 0, 2]}))  # type: ignore[arg-type]
    assert finding.kind == "size_mismatch" and " aborts: " in finding.detail, finding.detail
    calls = [CollectiveCall(r, "all_reduce", 8 if r == 1 else 6, "float32", "sum") for r in (1, 0, 2)]
    assert _consequence(report, calls, [1, 0, 2]).aborting_ranks == [2]  # type: ignore[union-attr]


@pytest.mark.parametrize("order", [(1, 0, 2), (1, 2, 0), (0, 2, 1), (2, 0, 1)])
def test_two_receivers_one_message_kills_both_abort_and_neither_raises(order):
    # broadcast from rank 1 of 2 floats, ranks 0 and 2 receive 1 (tests/scripts/subgroup_mismatch.py
    # bc): both abort on the root's message, whoever posts when; the first one's reset must not fail
    # the second's receive from the root (real Gloo: both print what(), neither raises). The engine
    # failed it with "Connection reset by peer (rank 0 has exited)": its process raised, then aborted
    eng = Engine(3, {"WORLD": [0, 1, 2]}, AlphaBeta(alpha=1.0, beta=0.0))
    work = {r: eng.issue(r, "broadcast", Payload.full(2 if r == 1 else 1, "float32", 1), origin="t", root=1,
                         async_op=True) for r in order}
    eng.env.run()
    assert [eng.ranks[r].abort_error is not None for r in range(3)] == [True, False, True]
    assert not work[0].call.event.triggered and not work[2].call.event.triggered
    assert work[1].call.event.ok
