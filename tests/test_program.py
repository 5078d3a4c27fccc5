"""The scenario interpreter (simdist.program) that both drivers execute, and the joinable
registry both sides implement. Agreement of the two drivers on real Gloo is checked in
test_fidelity.py and test_real_backend.py."""

from __future__ import annotations

import subprocess
import sys

import pytest

from simdist.errors import ScenarioError
from simdist.program.actions import (
    P2P,
    Backward,
    CallJoinable,
    Collective,
    EndIteration,
    EnterPhase,
    Fail,
    Forward,
    SkipCollective,
    WaitDeferred,
)
from simdist.program.interpret import rank_actions
from simdist.scenario import load_scenario, parse_scenario
from simdist.sim import simulate
from simdist.torchmodels.registry import JOINABLE_KINDS, register_joinable
from simdist.vocab import is_declared_origin

from .conftest import SCENARIOS, run_cli


def actions(d: dict, rank: int) -> list:
    return list(rank_actions(parse_scenario(d), rank))


def test_collective_is_filled_for_each_rank_and_iteration():
    d = {"world_size": 2, "inputs": {"counts": [2, 1]}, "loop": [
        {"kind": "collective", "op": "broadcast", "value": "iteration", "root": 1, "reduce_op": "max", "async": True,
         "wait": "end_of_iteration", "name": "b"},
        {"kind": "collective", "op": "all_reduce", "value": "rank", "reduce_op": "max"}]}
    calls = [a for a in actions(d, 0) if isinstance(a, Collective)]
    assert [(c.op, c.value, c.root, c.reduce_op, c.wait, c.origin) for c in calls] == [
        ("broadcast", 0, 1, None, "end_of_iteration", "user.b"),
        ("all_reduce", 0, None, "max", "now", "user.loop[1]"),
        ("broadcast", 1, 1, None, "end_of_iteration", "user.b"),
        ("all_reduce", 0, None, "max", "now", "user.loop[1]"),
    ]
    assert [(c.op, c.value) for c in actions(d, 1) if isinstance(c, Collective)] == [("broadcast", 0), ("all_reduce", 1)]
    loop = actions(d, 1)[-6:]
    assert [type(a) for a in loop] == [Collective, Collective, WaitDeferred, EndIteration, EnterPhase, WaitDeferred]


def test_program_structure_and_after_section():
    d = {"world_size": 2, "inputs": {"counts": [1, 0]}, "model": {"params": [1]},
         "join": {"joinables": ["ddp"]},
         "loop": [{"kind": "forward"}, {"kind": "backward"}],
         "after": [{"kind": "collective", "op": "all_reduce", "value": "iteration", "async": True,
                    "wait": "end_of_iteration"}]}
    kinds = [type(a).__name__ for a in actions(d, 0)]
    assert kinds == ["EnterPhase", "BuildModel", "SetupDone", "EnterJoin", "EnterPhase", "Forward", "Backward",
                     "WaitDeferred", "EndIteration", "EnterPhase", "ExitJoin", "EnterPhase", "Collective",
                     "WaitDeferred"]
    after = [a for a in actions(d, 1) if isinstance(a, Collective)]
    assert [(c.value, c.wait) for c in after] == [(-1, "now")]  # end_of_iteration means now after the loop
    phases = [(a.phase, a.iteration) for a in actions(d, 0) if isinstance(a, EnterPhase)]
    assert phases == [("init", None), ("loop", 0), ("join_exit", None), ("after", None)]


def test_rank_outside_the_group_gets_torchs_warning_and_no_call():
    d = {"world_size": 3, "inputs": {"counts": [1, 1, 1]}, "groups": [{"name": "g", "ranks": [0, 1]}],
         "loop": [{"kind": "collective", "op": op, "group": "g", "numel": 2} for op in ("reduce_scatter", "all_to_all")]}
    skipped = [a for a in actions(d, 2) if isinstance(a, (Collective, SkipCollective))]
    assert all(isinstance(a, SkipCollective) for a in skipped)
    assert [a.warning for a in skipped] == [
        "Running reduce_scatter_single on global rank 2 which does not belong to the given group.",
        "Running all_to_all_single on global rank 2 which does not belong to the given group.",
    ]
    assert all(isinstance(a, Collective) for a in actions(d, 0) if isinstance(a, (Collective, SkipCollective)))
    rep = simulate(parse_scenario({**d, "inputs": {"counts": [2, 2, 2]}}))
    assert rep.ranks[2].warnings == [a.warning for a in skipped]  # shown once each, as Python does
    assert rep.ranks[2].trace == []


def test_backward_without_forward_ends_the_program():
    d = {"world_size": 1, "inputs": {"counts": [2]}, "model": {"params": [1]},
         "loop": [{"kind": "forward", "below": 1}, {"kind": "backward"}, {"kind": "collective", "op": "barrier"}]}
    acts = actions(d, 0)
    fail = next(i for i, a in enumerate(acts) if isinstance(a, Fail))
    assert acts[fail].message == "loop[1]: backward without a forward earlier in this iteration"
    assert acts[fail + 1:] == []
    assert [type(a) for a in acts[:fail] if isinstance(a, (Forward, Backward))] == [Forward, Backward]
    rep = simulate(parse_scenario(d))
    assert rep.ranks[0].error.type == "RuntimeError" and rep.ranks[0].inputs_processed == 1


def test_num_allreduces_and_p2p_sides():
    d = {"world_size": 3, "inputs": {"counts": [1, 1, 1]}, "joinables": [{"name": "a", "kind": "allreducer"}],
         "join": {"joinables": ["a"], "kwargs": {"num_allreduces": 3}},
         "loop": [{"kind": "joinable_call", "joinable": "a"}, {"kind": "joinable_call", "joinable": "a",
                                                                "num_allreduces": 2},
                  {"kind": "p2p", "src": 0, "dst": 1, "value": 7, "observe": "x", "blocking": False,
                   "wait": "end_of_iteration"}]}
    assert [a.num_allreduces for a in actions(d, 0) if isinstance(a, CallJoinable)] == [3, 2]
    p0, p1 = ([a for a in actions(d, r) if isinstance(a, P2P)] for r in (0, 1))
    assert [(a.op, a.peer, a.value, a.observe, a.wait) for a in p0 + p1] == [
        ("send", 1, 7.0, None, "end_of_iteration"), ("recv", 0, 0, "x", "end_of_iteration")]
    assert not [a for a in actions(d, 2) if isinstance(a, P2P)]


def test_interpreter_needs_neither_torch_nor_simpy():
    code = ("import sys; from simdist.program.interpret import rank_actions; from simdist.scenario import "
            "parse_scenario; list(rank_actions(parse_scenario({'world_size': 2, 'inputs': {'counts': [1, 1]}, "
            "'loop': [{'kind': 'collective', 'op': 'all_reduce'}]}), 0)); "
            "print(sorted(m for m in ('torch', 'simpy') if m in sys.modules))")
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"


# --------------------------------------------------------------------------- joinable registry
def test_real_registry_implements_exactly_the_kinds_marked_real():
    pytest.importorskip("torch")
    from real_backend.joinables import REAL_JOINABLES

    assert set(REAL_JOINABLES) == {k for k, v in JOINABLE_KINDS.items() if v.real}
    assert set(REAL_JOINABLES) == {"counter", "allreducer"}


def test_register_joinable_takes_scenario_joinables_only():
    with pytest.raises(ValueError, match="reserved"):
        register_joinable("ddp", JOINABLE_KINDS["counter"].sim)
    with pytest.raises(TypeError):
        register_joinable("x", dict)  # type: ignore[arg-type]


def test_a_kind_without_real_implementation_is_rejected_at_load(tmp_scenario):
    text = ("world_size = 2\n[inputs]\ncounts = [1, 1]\n[[joinables]]\nname = 'c'\nkind = 'counter'\n"
            "[[joinables]]\nname = 't'\nkind = 'sim_only'\n")
    register_joinable("sim_only", JOINABLE_KINDS["counter"].sim)
    try:
        p = tmp_scenario(text)
        assert load_scenario(p).joinables[1].kind == "sim_only"
        with pytest.raises(ScenarioError, match=r"joinables\[1\]\.kind: 'sim_only' has no real implementation"):
            load_scenario(p, target="real")
    finally:
        JOINABLE_KINDS.pop("sim_only")
    with pytest.raises(ScenarioError, match=r"joinables\[1\]\.kind: unknown joinable kind 'sim_only'"):
        load_scenario(p)


def test_run_real_rejects_it_before_starting_a_process():
    pytest.importorskip("torch")
    from real_backend.launch import run_real

    register_joinable("sim_only", JOINABLE_KINDS["counter"].sim)
    try:
        s = parse_scenario({"world_size": 2, "inputs": {"counts": [1, 1]},
                            "joinables": [{"name": "t", "kind": "sim_only"}]})
        with pytest.raises(ScenarioError, match=r"joinables\[0\]\.kind: 'sim_only' has no real implementation"):
            run_real(s)
    finally:
        JOINABLE_KINDS.pop("sim_only")


def test_cli_real_and_compare_reject_it_in_one_line(tmp_scenario):
    # the kind is registered only in this process: the CLI subprocess sees an unknown kind,
    # which must fail the same way (one line naming the field, exit 2) before any process starts
    p = tmp_scenario("world_size = 2\n[inputs]\ncounts = [1, 1]\n[[joinables]]\nname = 't'\nkind = 'tally'\n")
    for cmd in ("real", "compare"):
        res = run_cli(cmd, str(p))
        assert res.returncode == 2, res.stderr
        assert res.stderr.strip().count("\n") == 0 and "joinables[0].kind" in res.stderr


def test_the_simulator_emits_only_declared_origins():
    """Every origin label on a simulated trace is one `simdist.vocab.ORIGINS` declares (or the
    `user.` family): the checker's hints and the comparison with real runs read them.
    test_fidelity.py asserts the same of the real recorder's traces."""
    seen = set()
    for path in sorted(SCENARIOS.glob("*.toml")):
        seen |= {e.origin for r in simulate(load_scenario(path)).ranks for e in r.trace}
    assert {o for o in seen if not is_declared_origin(o)} == set()
    assert any(o.startswith("ddp.") for o in seen) and any(o.startswith("user.") for o in seen)
