"""Models of Join, DDP, ZeRO and custom joinables: sequences and values derived from torch 2.13's
source (join.py, distributed.py + reducer.cpp, zero_redundancy_optimizer.py) and its own join
tests. Agreement with real Gloo runs is checked in test_fidelity.py."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

import pytest

from simdist.engine.values import Payload
from simdist.scenario import parse_scenario
from simdist.sim import simulate
from simdist.torchmodels.buckets import compute_bucket_assignment_by_size
from simdist.torchmodels.join import Join, JoinHook
from simdist.torchmodels.joinables import ScenarioJoinable
from simdist.torchmodels.registry import JOINABLE_KINDS, register_joinable
from simdist.torchmodels.zero import partition_parameters

DDP_LOOP = [{"kind": "forward"}, {"kind": "backward"}]


def ddp(counts, params=([1, 1], [1]), join=True, **model):
    d = {"world_size": len(counts), "inputs": {"counts": list(counts)}, "model": {"params": list(params), **model},
         "loop": list(DDP_LOOP), "on_finish": "stay"}
    if join:
        d["join"] = {"joinables": ["ddp"]} if join is True else join
    return simulate(parse_scenario(d))


def keys(rank_result):
    return [(e.op, e.numel, e.dtype, e.origin) for e in rank_result.trace]


def test_ddp_tutorial_sequence_matches_join_protocol():
    rep = ddp([5, 6])
    assert rep.outcome == "completed"
    init = [("all_gather", 1, "int64", "ddp.init.verify_params"), ("broadcast", 6, "int64", "ddp.init.verify_params"),
            ("broadcast", 2, "float32", "ddp.init.sync_module_states")]
    hb = ("all_reduce", 1, "float32", "join.notify_join_context.heartbeat")
    rgs = ("all_reduce", 1, "float32", "ddp.pre_forward.requires_grad_sync")
    bucket = ("all_reduce", 2, "float32", "ddp.backward.bucket_allreduce")
    rebuild = [("broadcast", 3, "int32", "ddp.pre_forward.rebuild_buckets"),
               ("broadcast", 1, "int32", "ddp.pre_forward.rebuild_buckets")]
    it = [hb, rgs, bucket]
    expected1 = init + it + [hb, *rebuild, rgs, bucket] + it * 4 + [
        ("all_reduce", 1, "float32", "join.exit.count_nonjoined"),
        ("all_reduce", 1, "int64", "ddp.post_hook.find_common_rank"),
        ("broadcast", 2, "float32", "ddp.post_hook.broadcast_final_model"),
    ]
    assert keys(rep.ranks[1]) == expected1
    shadow = [("all_reduce", 1, "float32", "join.exit.count_nonjoined"),
              ("all_reduce", 1, "float32", "ddp.join_hook.requires_grad_sync"),
              ("all_reduce", 2, "float32", "ddp.join_hook.bucket_allreduce")]
    assert keys(rep.ranks[0])[: 3 + 3 * 5 + 2] == expected1[: 3 + 3 * 5 + 2]
    assert keys(rep.ranks[0])[20:23] == shadow
    # final model broadcast from the last joiner (rank 1)
    assert rep.ranks[0].trace[-1].root == 1 and rep.ranks[1].trace[-1].root == 1


@pytest.mark.parametrize("n", [2, 6, 8])
def test_ddp_collective_totals(n):
    # join-protocol.md: every rank issues 3 + 3N + 2 + 3 collectives for Join([DDP(Linear(1,1))])
    rep = ddp([2, n])
    assert [len(r.trace) for r in rep.ranks] == [3 + 3 * n + 2 + 3] * 2


def test_rank_with_zero_inputs_rebuilds_in_second_shadow_iteration():
    rep = ddp([0, 3])
    assert rep.outcome == "completed"
    origins = [e.origin for e in rep.ranks[0].trace]
    first_rebuild = origins.index("ddp.join_hook.rebuild_buckets")
    # count AR (1st shadow), RGS, bucket, then count AR (2nd shadow) and the rebuild broadcasts
    assert origins[3:first_rebuild] == ["join.exit.count_nonjoined", "ddp.join_hook.requires_grad_sync",
                                        "ddp.join_hook.bucket_allreduce", "join.exit.count_nonjoined"]
    assert len(rep.ranks[0].trace) == len(rep.ranks[1].trace)


def test_find_unused_parameters_never_rebuilds_and_allreduces_used_map():
    rep = ddp([2, 3], params=[4, 4, 4], find_unused_parameters=True, unused_params=[1])
    assert rep.outcome == "completed"
    o = [e.origin for e in rep.ranks[1].trace]
    assert "ddp.pre_forward.rebuild_buckets" not in o
    maps = [e for e in rep.ranks[1].trace if e.origin == "ddp.backward.unused_map_allreduce"]
    assert len(maps) == 3 and all(e.numel == 3 and e.dtype == "int32" for e in maps)
    assert sum(e.origin == "ddp.join_hook.unused_map_allreduce" for e in rep.ranks[0].trace) == 1


def test_bucket_assignment_matches_reducer():
    mb = 1024 * 1024
    # rebuilt order is gradient-ready order (reverse registration); 1 MiB first bucket, then 25 MiB
    numels = [400_000, 300_000, 200_000, 100_000]  # floats: 1.6 MB, 1.2 MB, 0.8 MB, 0.4 MB
    order = [3, 2, 1, 0]
    b = compute_bucket_assignment_by_size([numels[i] for i in order], ["float32"] * 4, [mb, 25 * mb], order)
    assert b == [[3, 2], [1, 0]]  # 0.4 + 0.8 MB crosses the 1 MiB first cap; the rest fits 25 MiB
    # initial assignment sorts buckets by smallest index; DDP reverses them
    b0 = compute_bucket_assignment_by_size(numels, ["float32"] * 4, [mb])
    assert b0 == [[0], [1], [2, 3]]


def test_rebuilt_buckets_used_from_iteration_two():
    rep = ddp([4, 4], params=[400_000, 300_000, 200_000, 100_000], join=False)
    sizes = [e.numel for e in rep.ranks[0].trace if e.origin == "ddp.backward.bucket_allreduce"]
    assert sizes == [1_000_000] + [300_000, 700_000] * 3


def test_zero_partition_is_greedy_by_size():
    assert partition_parameters([1, 1], 2) == [[0], [1]]
    assert partition_parameters([1, 1], 3) == [[0], [1], []]
    assert partition_parameters([10, 30, 20, 5], 2) == [[1, 3], [2, 0]]


def test_ddp_zero_two_broadcasts_per_step_with_roots():
    rep = simulate(parse_scenario({"world_size": 2, "inputs": {"counts": [5, 6]}, "model": {"params": [[1, 1], [1]]},
                                   "optimizer": {"kind": "adam", "zero": True}, "join": {"joinables": ["ddp", "zero"]},
                                   "loop": DDP_LOOP + [{"kind": "optimizer_step"}]}))
    assert rep.outcome == "completed" and [len(r.trace) for r in rep.ranks] == [38, 38]
    bcs = [(e.root, e.origin) for e in rep.ranks[0].trace if e.origin.startswith("zero")]
    assert bcs[:2] == [(0, "zero.step.broadcast_shard"), (1, "zero.step.broadcast_shard")]
    assert bcs[-2:] == [(0, "zero.join_hook.broadcast_shard"), (1, "zero.join_hook.broadcast_shard")]


def test_divide_by_initial_world_size_changes_gradient_values():
    def grads(divide):
        rep = simulate(parse_scenario({
            "world_size": 2, "inputs": {"counts": [1, 2]},
            "model": {"params": [[1, 1], [1]], "observe_grad": True},
            "optimizer": {"kind": "sgd"},
            "join": {"joinables": ["ddp"], "kwargs": {"divide_by_initial_world_size": divide}},
            "loop": DDP_LOOP + [{"kind": "optimizer_step"}]}))
        return rep.ranks[1].observed["ddp.grad"]
    # iteration 1: both ranks contribute 1/2; iteration 2 only rank 1: 1/2 (initial W) or 1/1
    assert grads(True) == [1.0, 0.5]
    assert grads(False) == [1.0, 1.0]


@pytest.mark.parametrize("world", [2, 3, 4])
def test_allreducer_totals_match_torch_test(world):
    # test_join.py: expected_total = W*base + sum_{j=1..rank} (W - j)*offset, base 3, offset 1
    rep = simulate(parse_scenario({
        "world_size": world, "inputs": {"base": 3, "offset": 1},
        "joinables": [{"name": "a", "kind": "allreducer"}],
        "join": {"joinables": ["a"], "kwargs": {"num_allreduces": 1, "run_post_hooks": True}},
        "loop": [{"kind": "joinable_call", "joinable": "a"}]}))
    for r in range(world):
        expected = world * 3 + sum((world - j) for j in range(1, r + 1))
        assert rep.ranks[r].observed["a.total"] == expected
        assert rep.ranks[r].observed["a.post_hook_tensor"] == 42


def test_throw_on_early_termination_messages():
    rep = simulate(parse_scenario({
        "world_size": 3, "inputs": {"base": 3, "offset": 1},
        "joinables": [{"name": "a", "kind": "allreducer"}],
        "join": {"joinables": ["a"], "throw_on_early_termination": True},
        "loop": [{"kind": "joinable_call", "joinable": "a"}]}))
    msgs = [r.error.message for r in rep.ranks]
    assert msgs[0] == "Rank 0 exhausted all inputs."
    assert msgs[1] == msgs[2] == "Detected at least one rank that exhausted inputs. Throwing across all ranks."


def test_enable_false_issues_no_join_collectives():
    rep = ddp([3, 3], join={"joinables": ["ddp"], "enabled": False})
    assert rep.outcome == "completed"
    assert not any(e.origin.startswith("join.") or "requires_grad_sync" in e.origin for e in rep.ranks[0].trace)


def test_joinables_on_different_groups_raise_on_every_rank():
    rep = simulate(parse_scenario({
        "world_size": 2, "inputs": {"counts": [1, 1]}, "groups": [{"name": "g", "ranks": [0, 1]}],
        "joinables": [{"name": "a", "kind": "counter"}, {"name": "b", "kind": "counter", "group": "g"}],
        "join": {"joinables": ["a", "b"]}, "loop": []}))
    assert [r.error.message for r in rep.ranks] == ["Using join context manager with multiple process groups"] * 2


def test_uneven_skew_warning_after_1000_shadow_passes():
    rep = simulate(parse_scenario({
        "world_size": 2, "inputs": {"counts": [0, 1003]}, "joinables": [{"name": "c", "kind": "counter"}],
        "join": {"joinables": ["c"]}, "loop": [{"kind": "joinable_call", "joinable": "c"}]}))
    assert rep.outcome == "completed"
    assert any("uneven input skew of greater than 1000" in w for w in rep.ranks[0].warnings)
    assert not rep.ranks[1].warnings


def test_zero_before_ddp_misaligns_shadow_sequence():
    rep = simulate(parse_scenario({
        "world_size": 2, "inputs": {"counts": [3, 4]}, "model": {"params": [[1, 1], [1]]},
        "optimizer": {"kind": "adam", "zero": True}, "join": {"joinables": ["zero", "ddp"]},
        "loop": DDP_LOOP + [{"kind": "optimizer_step"}], "on_finish": "stay"}))
    assert rep.outcome != "completed"
    assert rep.findings  # the joined rank's heartbeat pairs with something else


class Tally(ScenarioJoinable):
    """A user joinable: each call all-reduces its rank; the hook shadows with zeros."""

    def __init__(self, dist, name, group="WORLD"):
        super().__init__(dist, name, group)
        self.total = 0.0

    def call(self, num_allreduces) -> Generator[Any, Any, None]:
        yield from Join.notify_join_context(self)
        res = yield from self.dist.all_reduce(Payload.full(1, "float32", self.dist.rank + 1), origin="user.tally")
        self.total += res.item()

    def join_hook(self, **kwargs) -> JoinHook:
        outer = self

        class Hook(JoinHook):
            def main_hook(self):
                yield from outer.dist.all_reduce(Payload.full(1, "float32", 0.0), origin="user.tally.shadow")

        return Hook()

    def observed(self):
        return {f"{self.name}.total": self.total}


def test_custom_joinable_python_api():
    register_joinable("tally", Tally)
    try:
        rep = simulate(parse_scenario({
            "world_size": 2, "inputs": {"counts": [1, 3]}, "joinables": [{"name": "t", "kind": "tally"}],
            "join": {"joinables": ["t"]}, "loop": [{"kind": "joinable_call", "joinable": "t"}]}))
    finally:
        JOINABLE_KINDS.pop("tally")
    assert rep.outcome == "completed"
    # iteration 1: 1 + 2 = 3; then rank 0 shadows with zeros: rank 1 adds 2 twice
    assert rep.ranks[1].observed["t.total"] == 7.0 and rep.ranks[0].observed["t.total"] == 3.0


def test_rebuilt_layout_comes_from_rank_0_even_with_no_inputs():
    # rank 0's rebuilt params come from _push_all_rebuilt_params (registration order): with a
    # 16-byte cap that is one bucket [0, 1]; rank 1's own ready order would give [[1], [0]].
    rep = ddp([0, 2], params=[3, 5], bucket_cap_mb=1.6e-05)
    assert rep.outcome == "completed" and not rep.findings
    sizes = [e.numel for e in rep.ranks[1].trace if e.origin == "ddp.backward.bucket_allreduce"]
    assert sizes == [8, 8]
    rebuild = [e.numel for e in rep.ranks[1].trace if e.origin == "ddp.pre_forward.rebuild_buckets"]
    assert rebuild == [3, 1]


@pytest.mark.parametrize(("cls", "error"), [
    # torch's test AllReducer asserts a last joiner exists (real_backend/joinables.py raises the same)
    ("allreducer", ("AssertionError", "no last joiner: common rank is -1")),
    # the tutorial Counter does not check: it broadcasts from -1, which ProcessGroupGloo refuses
    ("counter", ("RuntimeError", "ProcessGroupGloo::broadcast: invalid root rank: -1")),
])
def test_post_hook_when_no_rank_was_the_last_joiner(cls, error):
    from simdist.engine.core import Engine, RankRaised
    from simdist.sim import AlphaBeta
    from simdist.torchmodels.dist import Dist

    engine = Engine(2, {"WORLD": [0, 1]}, AlphaBeta())
    raised = {}

    def rank(r):
        hook = JOINABLE_KINDS[cls].sim(Dist(engine, r), "j").join_hook(sync_max_count=True, run_post_hooks=True)
        try:
            yield from hook.post_hook(False)
        except RankRaised as e:
            raised[r] = (e.error.type, e.error.message, e.error.category)

    for r in range(2):
        engine.env.process(rank(r))
    engine.env.run()
    assert raised == {0: (*error, "other"), 1: (*error, "other")}


def test_ddp_vote_that_met_another_collective_is_refused_as_torch_refuses_it():
    """DDP's buffer-sync vote (all-reduce MAX of the rank) meeting a bucket all-reduce of
    another size reads bytes that are no rank: `_broadcast_coalesced` refuses the source
    (TypeError) on the voters instead of the simulator indexing past the group (IndexError,
    an internal error). `simdist compare` of this scenario agrees with real Gloo rank for rank."""
    d = {"world_size": 5, "inputs": {"counts": [14, 29, 7, 10, 12]}, "on_finish": "stay",
         "model": {"params": [[1, 1], [1]], "buffers": [2], "bucket_cap_mb": 25.0, "find_unused_parameters": True},
         "optimizer": {}, "joinables": [{"name": "allreducer", "kind": "allreducer"}],
         "join": {"joinables": ["ddp"], "kwargs": {"sync_max_count": True}},
         "loop": [{"kind": "forward"}, {"kind": "backward"}, {"every": 4, "kind": "forward"},
                  {"every": 2, "ranks": [0, 1], "kind": "forward"}]}
    rep = simulate(parse_scenario(d))
    assert rep.outcome == "error"
    assert [r.error.type for r in rep.ranks[:2]] == ["TypeError", "TypeError"]
    assert rep.ranks[4].status == "aborted"
