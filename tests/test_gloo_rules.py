"""Unit tests of simdist.engine.gloo_rules, encoding outcomes observed on real Gloo.

Every expectation below was observed with bench/gloo_mismatch_probe.py on torch
2.13.0+cpu (Gloo tcp transport, 127.0.0.1, PG timeout 4 s); see docs/gloo-mismatch.md.
Inputs in the probe: rank r fills element i with 100*(r+1)+i.
"""

from __future__ import annotations

import math

import pytest

from simdist.engine.gloo_rules import (
    CollectiveCall,
    classify_mismatch,
    mixed_result,
)
from simdist.vocab import dtype_bytes


def AR(rank, numel=1, dtype="float32", op="SUM"):
    return CollectiveCall(rank=rank, op="all_reduce", numel=numel, dtype=dtype, reduce_op=op)


def BC(rank, numel=1, dtype="float32", root=0):
    return CollectiveCall(rank=rank, op="broadcast", numel=numel, dtype=dtype, root=root)


def AG(rank, numel=1, dtype="float32"):
    return CollectiveCall(rank=rank, op="all_gather", numel=numel, dtype=dtype)


def BAR(rank):
    return CollectiveCall(rank=rank, op="barrier")


def probe_inputs(entries):
    return {e.rank: [100 * (e.rank + 1) + i for i in range(e.numel)] for e in entries}


# (case name, entries, W, expected kind, expected per-rank outcome)
OBSERVED = [
    ("ctl_ar_f32x1", [AR(0), AR(1)], 2, "ok", {0: "ok", 1: "ok"}),
    ("ctl_barrier", [BAR(0), BAR(1)], 2, "ok", {0: "ok", 1: "ok"}),
    # same byte size, different dtype: depends on the message schedule, not on bytes
    ("ar_f32x2_vs_i64x1", [AR(0, 2), AR(1, 1, "int64")], 2, "abort",
     {0: "abort", 1: "peer_error"}),
    ("ar_f32x1_vs_i32x1", [AR(0, 1), AR(1, 1, "int32")], 2, "silent", {0: "ok", 1: "ok"}),
    ("ar_sum_vs_max_x4", [AR(0, 4), AR(1, 4, op="MAX")], 2, "silent", {0: "ok", 1: "ok"}),
    ("ar_sum_vs_avg_x4", [AR(0, 4), AR(1, 4, op="AVG")], 2, "silent", {0: "ok", 1: "ok"}),
    # different numel, same dtype
    ("ar_numel_1_vs_2", [AR(0, 1), AR(1, 2)], 2, "hang", {0: "hang", 1: "hang"}),
    ("ar_numel_2_vs_1", [AR(0, 2), AR(1, 1)], 2, "hang", {0: "hang", 1: "hang"}),
    ("ar_numel_1_vs_4", [AR(0, 1), AR(1, 4)], 2, "hang", {0: "ok", 1: "hang"}),
    ("ar_numel_3_vs_4", [AR(0, 3), AR(1, 4)], 2, "hang", {0: "ok", 1: "hang"}),
    ("ar_numel_4_vs_8", [AR(0, 4), AR(1, 8)], 2, "abort", {0: "abort", 1: "peer_error"}),
    ("ar_numel_1000_vs_1001", [AR(0, 1000), AR(1, 1001)], 2, "abort",
     {0: "abort", 1: "abort"}),
    ("ar_numel_1M_vs_2M", [AR(0, 1 << 20), AR(1, 1 << 21)], 2, "hang", {0: "ok", 1: "hang"}),
    ("ar_f64_numel_1_vs_2", [AR(0, 1, "float64"), AR(1, 2, "float64")], 2, "hang",
     {0: "hang", 1: "hang"}),
    # different byte size
    ("ar_i64x1_vs_f32x1", [AR(0, 1, "int64"), AR(1, 1)], 2, "abort", {0: "ok", 1: "abort"}),
    ("ar_f32x1_vs_i64x1", [AR(0, 1), AR(1, 1, "int64")], 2, "abort",
     {0: "abort", 1: "peer_error"}),
    # broadcast
    ("bc_root0_vs_root1", [BC(0, root=0), BC(1, root=1)], 2, "hang", {0: "hang", 1: "hang"}),
    ("bc_numel_root1_vs_2", [BC(0, 1), BC(1, 2)], 2, "silent", {0: "ok", 1: "ok"}),
    ("bc_numel_root2_vs_1", [BC(0, 2), BC(1, 1)], 2, "abort", {0: "ok", 1: "abort"}),
    ("bc_f32_vs_i32", [BC(0, 1), BC(1, 1, "int32")], 2, "silent", {0: "ok", 1: "ok"}),
    # different kinds never match (different slot prefixes)
    ("ar_vs_bc_same_bytes", [AR(0), BC(1)], 2, "hang", {0: "hang", 1: "hang"}),
    ("ar_vs_bc_diff_bytes", [AR(0), BC(1, 2)], 2, "hang", {0: "hang", 1: "hang"}),
    ("ar_vs_barrier", [AR(0), BAR(1)], 2, "hang", {0: "hang", 1: "hang"}),
    ("ar_vs_allgather", [AR(0), AG(1)], 2, "hang", {0: "hang", 1: "hang"}),
    ("bc_vs_allgather", [BC(0), AG(1)], 2, "hang", {0: "hang", 1: "hang"}),
    ("barrier_vs_bc", [BAR(0), BC(1)], 2, "hang", {0: "hang", 1: "hang"}),
    ("ar_vs_recv", [AR(0), CollectiveCall(1, "recv", 1, "float32", None, 0)], 2, "hang",
     {0: "hang", 1: "hang"}),
    ("send_vs_ar", [CollectiveCall(0, "send", 1, "float32", None, 1), AR(1)], 2, "hang",
     {0: "hang", 1: "hang"}),
    # all_gather
    ("ag_numel_1_vs_2", [AG(0, 1), AG(1, 2)], 2, "abort", {0: "abort", 1: "ok"}),
    ("ag_numel_2_vs_1", [AG(0, 2), AG(1, 1)], 2, "abort", {0: "ok", 1: "abort"}),
    ("ag_f32_vs_i32", [AG(0, 1), AG(1, 1, "int32")], 2, "silent", {0: "ok", 1: "ok"}),
    # an empty all_gather returns at once (observed with a two-process script, not the probe)
    ("ag_numel_0_vs_1", [AG(0, 0), AG(1, 1)], 2, "hang", {0: "ok", 1: "hang"}),
    # world size 3
    ("w3_ar_numel_r0_2", [AR(0, 2), AR(1), AR(2)], 3, "hang",
     {0: "hang", 1: "hang", 2: "hang"}),
    ("w3_ar_numel_r2_2", [AR(0), AR(1), AR(2, 2)], 3, "hang", {0: "ok", 1: "ok", 2: "hang"}),
    ("w3_ar_numel_r0_1_others_2", [AR(0, 1), AR(1, 2), AR(2, 2)], 3, "hang",
     {0: "ok", 1: "hang", 2: "hang"}),
    ("w3_ar_numel_r2_1_others_2", [AR(0, 2), AR(1, 2), AR(2, 1)], 3, "hang",
     {0: "hang", 1: "hang", 2: "hang"}),
    ("w3_ar_i64_r0", [AR(0, 1, "int64"), AR(1), AR(2)], 3, "abort",
     {0: "ok", 1: "peer_error", 2: "abort"}),
    ("w3_ar_i64_r2", [AR(0), AR(1), AR(2, 1, "int64")], 3, "abort",
     {0: "peer_error", 1: "abort", 2: "hang"}),
    ("w3_ar_vs_bc_r1", [AR(0), BC(1), AR(2)], 3, "hang", {0: "hang", 1: "hang", 2: "hang"}),
    ("w3_ar_sum_max_r1", [AR(0, 3), AR(1, 3, op="MAX"), AR(2, 3)], 3, "silent",
     {0: "ok", 1: "ok", 2: "ok"}),
    ("w3_bc_numel_r2_small", [BC(0, 2), BC(1, 2), BC(2, 1)], 3, "abort",
     {0: "ok", 1: "ok", 2: "abort"}),
    # world size 4
    ("w4_ar_numel_r3_2", [AR(0), AR(1), AR(2), AR(3, 2)], 4, "hang",
     {0: "ok", 1: "ok", 2: "ok", 3: "hang"}),
    ("w4_ar_numel_r1_8_vs_4", [AR(0, 4), AR(1, 8), AR(2, 4), AR(3, 4)], 4, "hang",
     {0: "ok", 1: "hang", 2: "ok", 3: "ok"}),
    ("w4_ar_vs_barrier_r2", [AR(0), AR(1), BAR(2), AR(3)], 4, "hang",
     {0: "hang", 1: "hang", 2: "hang", 3: "hang"}),
    ("w4_bc_numel_r3_small", [BC(0, 2), BC(1, 2), BC(2, 2), BC(3, 1)], 4, "abort",
     {0: "ok", 1: "ok", 2: "ok", 3: "abort"}),
    # sub-groups (group ranks): new_group([1, 2, 3]) and new_group([1, 2]) of a larger world
    ("w4_sub123_ar_i64_vs_f32", [AR(0, 1, "int64"), AR(1), AR(2)], 3, "abort",
     {0: "ok", 1: "peer_error", 2: "abort"}),
    ("w3_sub12_ar_f32x2_vs_i64", [AR(0, 2), AR(1, 1, "int64")], 2, "abort",
     {0: "abort", 1: "peer_error"}),
    ("w3_sub01_ar_numel_1_vs_2", [AR(0, 1), AR(1, 2)], 2, "hang", {0: "hang", 1: "hang"}),
]


@pytest.mark.parametrize("name,entries,w,kind,outcomes", OBSERVED, ids=[c[0] for c in OBSERVED])
def test_observed_outcomes(name, entries, w, kind, outcomes):
    v = classify_mismatch(entries, w)
    assert v.kind == kind, v.detail
    assert v.rank_outcomes == outcomes, v.detail
    assert v.aborting_ranks == sorted(r for r, o in outcomes.items() if o == "abort")
    assert v.detail


# Which operation the timeout message names ("Timed out waiting 4000ms for X operation")
TIMEOUT_OP = [
    ("ar_numel_1_vs_2", [AR(0, 1), AR(1, 2)], 2, {0: "send", 1: "send"}),
    ("ar_numel_1_vs_4", [AR(0, 1), AR(1, 4)], 2, {1: "recv"}),
    ("ar_vs_allgather", [AR(0), AG(1)], 2, {0: "recv", 1: "send"}),
    ("ag_numel_0_vs_1", [AG(0, 0), AG(1, 1)], 2, {1: "send"}),
    ("w3_ar_vs_bc_r1", [AR(0), BC(1), AR(2)], 3, {0: "recv", 1: "recv", 2: "send"}),
    ("w4_ar_numel_r1_8_vs_4", [AR(0, 4), AR(1, 8), AR(2, 4), AR(3, 4)], 4, {1: "send"}),
]


@pytest.mark.parametrize("name,entries,w,ops", TIMEOUT_OP, ids=[c[0] for c in TIMEOUT_OP])
def test_timeout_names_send_or_recv(name, entries, w, ops):
    v = classify_mismatch(entries, w)
    assert {r: s.split()[0] for r, s in v.blocked_on.items()} == ops


def test_abort_detail_names_sizes():
    v = classify_mismatch([AR(0, 1, "int64"), AR(1, 1)], 2)
    assert "8 vs 4" in v.detail and "rank 1" in v.detail
    v = classify_mismatch([AR(0, 1000), AR(1, 1001)], 2)
    assert v.aborting_ranks == [0, 1]  # observed: "1004 vs 1000" on r0, "1000 vs 992" on r1
    assert "1004 vs 1000" in v.detail


# --- peers that have exited -------------------------------------------------------------


def test_exited_peer_w2_immediate_peer_error():
    # observed (destroy+exit, exit without destroy, os._exit; AR or BC; before or while
    # blocked): "Connection closed by peer" at once / at the moment the peer exits
    for call in (AR(0), BC(0, root=1)):
        v = classify_mismatch([call], 2, exited={1})
        assert v.rank_outcomes == {0: "peer_error"}, v.detail


def test_exited_peer_w4_only_ring_neighbour_fails_fast():
    # observed: r3 exited; r2 (receives from r3 in the ring) peer_closed at once,
    # r0 and r1 block on live-but-stuck peers and time out
    v = classify_mismatch([AR(0), AR(1), AR(2)], 4, exited={3})
    assert v.rank_outcomes == {0: "hang", 1: "hang", 2: "peer_error"}
    assert v.kind == "hang"
    # each waits for the ring's next rank: its exit (after r2's error) fails the wait in turn
    assert v.waits_on == {0: {1}, 1: {2}}


def test_a_rank_left_waiting_after_an_abort_waits_on_its_live_ring_neighbour():
    # observed (w3_ar_i64_r2; tests/test_fidelity_gaps.py, abort_then_wait): r1 aborts, r0's
    # receive from r1 fails, r2 waits on r0 only (in global ranks too) and fails when r0 exits
    v = classify_mismatch([AR(0), AR(1), AR(2, dtype="int64")], 3)
    assert (v.kind, v.rank_outcomes) == ("abort", {0: "peer_error", 1: "abort", 2: "hang"})
    assert v.waits_on == {2: {0}}
    v = classify_mismatch([AR(4), AR(5), AR(9, dtype="int64")], 3)
    assert v.waits_on == {9: {4}}


def test_a_root_that_posted_before_a_peer_exited_still_feeds_the_others():
    # observed (tests/test_fidelity_gaps.py, exit_mid_broadcast): rank 1 exits as ranks 0 and 2
    # post a broadcast from 0; rank 0's send to 1 was posted before 1's sockets closed, so its
    # send to 2 follows and rank 2 completes; only rank 0 fails (in its wait). Had rank 0 known
    # (a later post), its first send would throw and rank 2 would wait for nothing.
    v = classify_mismatch([BC(0), BC(2)], 3, exited={1}, unaware={0: frozenset({1})})
    assert v.rank_outcomes == {0: "peer_error", 2: "ok"}
    v = classify_mismatch([BC(0), BC(2)], 3, exited={1})
    assert v.rank_outcomes == {0: "peer_error", 2: "hang"}


def test_scatter_and_gather_fail_exactly_the_ranks_with_a_message_pending_with_an_exited_member():
    # gloo/scatter.cc, gather.cc: leaves receive from (send to) the root only, the root posts
    # one message per leaf (tests/scripts/rooted_after_exit.py: a root that left fails every
    # leaf at once, as on real Gloo; the simulator judged them as hangs, not modelled)
    SC = lambda r, root=0: CollectiveCall(r, "scatter", 6, "float32", root=root)  # noqa: E731
    GA = lambda r, root=0: CollectiveCall(r, "gather", 2, "float32", root=root)  # noqa: E731
    for make in (SC, GA):
        v = classify_mismatch([make(1), make(2)], 3, exited={0})
        assert v.rank_outcomes == {1: "peer_error", 2: "peer_error"}, make
        # a leaf gone: only the root, which has a message pending with it, fails
        v = classify_mismatch([make(0), make(1)], 3, exited={2})
        assert v.rank_outcomes == {0: "peer_error", 1: "ok"}, make
    assert classify_mismatch([SC(r, root=1) for r in range(3)], 3).kind == "ok"
    # a leaf's gather input longer than the root's block: the root receives more than it posted
    v = classify_mismatch([GA(0), GA(1), CollectiveCall(2, "gather", 4, "float32", root=0)], 3)
    assert v.kind == "abort" and v.aborting_ranks == [0] and v.rank_outcomes[1] == "ok"
    with pytest.raises(NotImplementedError):
        mixed_result([GA(0), GA(1)], 2, {0: [1.0, 2.0], 1: [3.0, 4.0]})



def test_a_scatter_root_waits_on_each_block_alone():
    """gloo/scatter.cc: the root's input i is its own buffer, waited for in rank order, so a
    root blocked on a live rank's block times out, whoever else left (tests/scripts/
    scatter_roots.py: rank 2 naming itself root, the others rank 0; real Gloo times out ranks
    0 and 2 and completes rank 1; the simulator had one buffer for all blocks and failed rank
    2 with rank 1's exit)."""
    SC = lambda r, root: CollectiveCall(r, "scatter", 6, "float32", root=root)  # noqa: E731
    v = classify_mismatch([SC(0, 0), SC(1, 0), SC(2, 2)], 3)
    assert v.rank_outcomes == {0: "hang", 1: "ok", 2: "hang"}
    assert v.waits_on == {0: frozenset({2}), 2: frozenset({0})}
    assert v.blocked_on[0].startswith("send") and v.blocked_on[2].startswith("send")
    # rank 2's wait on block 0 comes first: rank 1 gone leaves it waiting (rank 0, whose
    # first block is rank 1's, fails) ...
    v = classify_mismatch([SC(0, 0), SC(2, 2)], 3, exited={1}, unaware={2: frozenset({1})})
    assert v.rank_outcomes == {0: "peer_error", 2: "hang"} and v.waits_on[2] == frozenset({0})
    # ... while a root whose first block's rank is gone fails at once
    v = classify_mismatch([SC(1, 0), SC(2, 2)], 3, exited={0}, unaware={2: frozenset({0})})
    assert v.rank_outcomes[2] == "peer_error"
    # every rank its own root, any world size: every root waits on its first peer
    for w in (2, 3, 4):
        v = classify_mismatch([SC(r, r) for r in range(w)], w)
        assert v.waits_on == {r: frozenset({0 if r else 1}) for r in range(w)}, w

def test_entries_must_cover_live_ranks():
    with pytest.raises(ValueError):
        classify_mismatch([AR(0)], 2)
    with pytest.raises(ValueError):
        classify_mismatch([AR(0), AR(0)], 2)


# --- values ------------------------------------------------------------------------------


def test_values_sum_vs_max_is_per_segment_patchwork():
    # ring with W=2 and 4 elements: rank 0 finishes elements 0,1 (its SUM), rank 1 finishes
    # elements 2,3 (its MAX); the finished segments are copied to everyone.
    e = [AR(0, 4), AR(1, 4, op="MAX")]
    res = mixed_result(e, 2, probe_inputs(e))
    assert res == {0: [300.0, 302.0, 202.0, 203.0], 1: [300.0, 302.0, 202.0, 203.0]}


def test_values_sum_vs_max_w3():
    e = [AR(0, 3), AR(1, 3, op="MAX"), AR(2, 3)]
    res = mixed_result(e, 3, probe_inputs(e))
    assert all(v == [400.0, 402.0, 404.0] for v in res.values())


def test_values_sum_vs_avg_divides_locally():
    e = [AR(0, 4), AR(1, 4, op="AVG")]
    res = mixed_result(e, 2, probe_inputs(e))
    assert res[0] == [300.0, 302.0, 304.0, 306.0]
    assert res[1] == [150.0, 151.0, 152.0, 153.0]


def test_values_float_vs_int_reinterpret_bytes():
    e = [AR(0, 1), AR(1, 1, "int32")]
    res = mixed_result(e, 2, probe_inputs(e))
    assert res == {0: [100.0], 1: [1120403456]}  # 0x42C80000 == 100.0f
    e = [BC(0, 1), BC(1, 1, "int32")]
    assert mixed_result(e, 2, probe_inputs(e)) == {0: [100.0], 1: [1120403456]}
    e = [AG(0, 1), AG(1, 1, "int32")]
    res = mixed_result(e, 2, probe_inputs(e))
    assert res[1] == [1120403456, 200]
    assert res[0][0] == 100.0 and math.isclose(res[0][1], 2.802596928649634e-43)


def test_values_short_broadcast_fills_prefix_only():
    e = [BC(0, 1), BC(1, 2)]
    assert mixed_result(e, 2, probe_inputs(e)) == {0: [100.0], 1: [100.0, 201.0]}


def test_values_completed_ranks_in_hang_cases():
    e = [AR(0, 4), AR(1, 8), AR(2, 4), AR(3, 4)]
    res = mixed_result(e, 4, probe_inputs(e))
    for r in (0, 2, 3):
        assert res[r] == [304.0, 306.0, 906.0, 909.0]
    assert res[1] is None
    e = [AR(0), AR(1), AR(2), AR(3, 2)]
    res = mixed_result(e, 4, probe_inputs(e))
    assert res[0] == [1000.0] and res[1] == [401.0] and res[2] == [401.0]
    e = [AR(0, 3), AR(1, 4)]
    assert mixed_result(e, 2, probe_inputs(e))[0] == [300.0, 302.0, 304.0]


def test_values_short_message_into_scratch_is_undefined():
    # int64 rank receives 4 bytes into its 8-byte ring scratch: the upper half is
    # uninitialised memory (observed 31193563236, different each run)
    e = [AR(0, 1, "int64"), AR(1, 1)]
    res = mixed_result(e, 2, probe_inputs(e))
    assert res == {0: [None], 1: None}


def test_large_buckets_are_cheap():
    e = [AR(0, 25_000_000), AR(1, 25_000_001), AR(2, 25_000_000)]
    v = classify_mismatch(e, 3)
    assert v.kind == "abort"


def test_unmodelled_ops_are_conservative():
    rs = [CollectiveCall(r, "reduce_scatter", 4, "float32", "SUM") for r in range(2)]
    assert classify_mismatch(rs, 2).kind == "ok"
    rs2 = [rs[0], CollectiveCall(1, "reduce_scatter", 8, "float32", "SUM")]
    v = classify_mismatch(rs2, 2)
    assert v.kind == "hang" and not v.modelled
    v = classify_mismatch([rs[0], AR(1)], 2)
    assert v.kind == "hang" and not v.modelled


def test_dtype_bytes():
    assert dtype_bytes("float32") == 4 and dtype_bytes("int64") == 8 and dtype_bytes("long") == 8
    assert dtype_bytes("bfloat16") == 2 and dtype_bytes("bool") == 1 and dtype_bytes("complex64") == 8


def test_identical_reduce_op_case_insensitive_and_ok():
    assert classify_mismatch([AR(0, op="sum"), AR(1, op="SUM")], 2).kind == "ok"
    assert classify_mismatch([BAR(0), BAR(1), BAR(2)], 3).kind == "ok"


def test_global_ranks_of_a_subgroup_are_mapped():
    # new_group([1, 2, 3]) observed: global r1 int64, r2/r3 float32 -> r3 aborts
    e = [AR(1, 1, "int64"), AR(2), AR(3)]
    v = classify_mismatch(e, 3)
    assert v.kind == "abort" and v.aborting_ranks == [3]
    assert v.rank_outcomes == {1: "ok", 2: "peer_error", 3: "abort"}
    # broadcast roots are mapped too
    e = [BC(1, 1, root=2), BC(2, 1, "int32", root=2)]
    assert mixed_result(e, 2, {1: [5.0], 2: [7]}) == {1: [pytest.approx(9.8e-45, rel=0.1)], 2: [7]}
    v = classify_mismatch([AR(0), AR(1), AR(2)], 4, exited={5})
    assert v.rank_outcomes == {0: "hang", 1: "hang", 2: "peer_error"}
    with pytest.raises(ValueError):
        classify_mismatch([BC(1, root=0), BC(2, root=0)], 2)


def test_values_reduce_leaves_ring_partials_on_non_roots():
    # observed (torch 2.13, reduce SUM of x_r[i] = 10**r * (i + 1), float32): the root holds
    # the sum; the others keep what gloo's ring reduce-scatter (reduce.cc) left in their tensor
    for w, n, root, observed in (
        (3, 7, 1, {0: [111, 222, 333, 444, 5, 6, 7], 1: [111, 222, 333, 444, 555, 666, 777],
                   2: [100, 200, 300, 400, 505, 606, 707]}),
        (4, 9, 2, {0: [1111, 2222, 3333, 4444, 5, 6, 7, 8, 99], 1: [1110, 2220, 3330, 4440, 5555, 6666, 7777, 8888, 90],
                   2: [1111, 2222, 3333, 4444, 5555, 6666, 7777, 8888, 9999],
                   3: [1000, 2000, 3000, 4000, 5005, 6006, 7007, 8008, 9099]}),
    ):
        calls = [CollectiveCall(r, "reduce", n, "float32", "SUM", root=root) for r in range(w)]
        got = mixed_result(calls, w, {r: [float(10**r * (i + 1)) for i in range(n)] for r in range(w)})
        assert got == {r: [float(v) for v in vals] for r, vals in observed.items()}


def test_reduce_with_an_exited_member_fails_only_its_ring_neighbours():
    # the ring reduce posts to rank - 1 and from rank + 1 first: a reduce posted after the only
    # peer left fails at once (tests/scripts/reduce_after_exit.py); in a ring of 4 without
    # rank 3, rank 2 (receives from 3) and rank 0 (sends to 3) fail, rank 1 waits on rank 2
    v = classify_mismatch([CollectiveCall(1, "reduce", 4, "int32", "SUM", root=1)], 2, exited={0})
    assert v.rank_outcomes == {1: "peer_error"}
    v = classify_mismatch([CollectiveCall(r, "reduce", 64, "float64", "MAX", root=0) for r in range(3)], 4,
                          exited={3})
    assert v.rank_outcomes == {0: "peer_error", 1: "hang", 2: "peer_error"} and v.waits_on == {1: {2}}
