"""The scenario language (issue 12): conditions as data, `stop`, flags, conditional values,
several named DDP models on their own groups, ZeRO and custom joinables on a named group,
per-rank compute durations; every problem of a file at once; the JSON schema.

What each construct means is decided once, by the interpreter; these tests pin that meaning
down on the actions and on simulated runs. That the real backend executes the same meaning
is shown on real Gloo by the bundled scenarios that use every construct (test_fidelity.py:
grad_accum_join, stop_early_no_flag, stop_early_flag, two_ddp_models, ddp_subgroup_metric,
subgroup_join_zero_counter)."""

from __future__ import annotations

import json

import pytest

from simdist.errors import ScenarioError
from simdist.program.actions import BuildModel, BuildOptimizer, Collective, Compute, EndIteration, EnterJoin, Forward
from simdist.program.interpret import rank_actions
from simdist.scenario import json_schema, load_scenario, parse_scenario, scenario_to_dict
from simdist.sim import simulate

from .conftest import ROOT, SCENARIOS, run_cli


def _iterations(cond: dict, n: int = 12, rank: int = 0) -> list[int]:
    """The iterations on which a collective step with condition `cond` runs on `rank`."""
    s = parse_scenario({"world_size": 2, "inputs": {"counts": [n, n]},
                        "loop": [{"kind": "collective", "op": "all_reduce", "value": "iteration", **cond}]})
    return [a.value for a in rank_actions(s, rank) if isinstance(a, Collective)]


@pytest.mark.parametrize("cond,expected", [
    ({"every": 4}, [0, 4, 8]),
    ({"every": 4, "offset": 3}, [3, 7, 11]),
    ({"not": {"every": 4, "offset": 3}}, [0, 1, 2, 4, 5, 6, 8, 9, 10]),
    ({"from_iteration": 2, "below": 5}, [2, 3, 4]),
    ({"any": [{"below": 2}, {"from_iteration": 10}]}, [0, 1, 10, 11]),
    ({"every": 2, "offset": 1, "not": {"from_iteration": 4, "below": 8}}, [1, 3, 9, 11]),
    ({"any": [{"every": 3}, {"every": 4, "offset": 1}], "below": 10}, [0, 1, 3, 5, 6, 9]),
    ({"ranks": [1]}, []),
    ({"any": [{"ranks": [1]}, {"every": 5}]}, [0, 5, 10]),
])
def test_conditions_combine_modulo_offset_negation_and_ranges(cond, expected):
    assert _iterations(cond) == expected
    # the same condition as Python says it: no other reading is possible
    assert _iterations({}, rank=0) == list(range(12))


def test_per_rank_conditional_value_and_flag_stop_agree_across_ranks():
    s = parse_scenario({"world_size": 3, "inputs": {"counts": [8, 8, 8]}, "loop": [
        {"kind": "collective", "op": "all_reduce", "reduce_op": "max", "observe": "stop",
         "value": {"when": {"ranks": [2], "from_iteration": 5}, "then": 1, "else": 0}},
        {"kind": "stop", "flag": "stop"},
        {"kind": "collective", "op": "all_reduce", "observe": "work"}]})
    rep = simulate(s)
    assert rep.outcome == "completed"
    assert [r.inputs_processed for r in rep.ranks] == [5, 5, 5]
    assert [r.observed["stop"] for r in rep.ranks] == [[0.0] * 5 + [1.0]] * 3
    assert [len(r.observed["work"]) for r in rep.ranks] == [5, 5, 5]  # the stopping iteration does no work


def test_a_stop_leaves_the_loop_waits_deferred_work_and_runs_join_exit_and_after():
    s = parse_scenario({"world_size": 2, "inputs": {"counts": [4, 4]}, "model": {"params": [1]},
                        "join": {"joinables": ["ddp"]},
                        "loop": [{"kind": "collective", "op": "all_reduce", "async": True, "wait": "end_of_iteration",
                                  "observe": "x"},
                                 {"kind": "stop", "from_iteration": 1},
                                 {"kind": "forward"}, {"kind": "backward"}],
                        "after": [{"kind": "collective", "op": "barrier"}]})
    kinds = [type(a).__name__ for a in rank_actions(s, 0)]
    loop1 = kinds.index("EnterPhase", kinds.index("EndIteration"))  # iteration 1 starts here
    assert kinds[loop1:] == ["EnterPhase", "Collective", "WaitDeferred", "EnterPhase", "ExitJoin", "EnterPhase",
                             "Collective", "WaitDeferred"]
    rep = simulate(s)
    assert rep.outcome == "completed"
    assert [r.inputs_processed for r in rep.ranks] == [1, 1]  # the stopping iteration does not count
    assert [len(r.observed["x"]) for r in rep.ranks] == [2, 2]  # its deferred work was waited
    assert [e.origin for e in rep.ranks[0].trace][-2:] == ["ddp.post_hook.broadcast_final_model", "user.after[0]"]


def test_stop_without_a_shared_decision_is_the_early_break_family():
    rep = simulate(load_scenario(SCENARIOS / "stop_early_no_flag.toml"))
    from simdist.check.explain import explain_report

    text = "\n".join(explain_report(rep, load_scenario(SCENARIOS / "stop_early_no_flag.toml")))
    assert "hint (a rank left its loop early): rank 1 stopped after 2 of its 6 inputs" in text
    assert "all-reduce a stop flag" in text


def test_per_rank_compute_durations_make_a_straggler():
    s = parse_scenario({"world_size": 3, "inputs": {"counts": [2, 2, 2]}, "loop": [
        {"kind": "compute", "seconds": [0.001, 0.010, 0.001]},
        {"kind": "collective", "op": "all_reduce"}]})
    assert [[a.seconds for a in rank_actions(s, r) if isinstance(a, Compute)] for r in range(3)] == [
        [0.001, 0.001], [0.010, 0.010], [0.001, 0.001]]
    rep = simulate(s)
    first = [r.trace[0] for r in rep.ranks]
    assert first[1].t_issue == pytest.approx(0.010)  # the straggler issues late ...
    assert all(e.t_done >= 0.010 for e in first)  # ... and everyone waits for it


def test_two_models_each_on_its_own_group_build_and_run_separately():
    s = load_scenario(SCENARIOS / "two_ddp_models.toml")
    acts = list(rank_actions(s, 0))
    assert [(a.model.name, a.model.group) for a in acts if isinstance(a, BuildModel)] == [
        ("encoder", "WORLD"), ("head", "head_pg")]
    assert [a.model for a in acts if isinstance(a, Forward)][:2] == ["encoder", "head"]
    opt = next(a for a in acts if isinstance(a, BuildOptimizer))
    assert opt.models == ("encoder", "head")
    rep = simulate(s)
    groups = {e.group for e in rep.ranks[0].trace if e.origin == "ddp.backward.bucket_allreduce"}
    assert groups == {"WORLD", "head_pg"}


def test_backward_of_a_model_without_its_forward_fails():
    s = parse_scenario({"world_size": 2, "inputs": {"counts": [1, 1]},
                        "models": [{"name": "a", "params": [1]}, {"name": "b", "params": [1]}],
                        "loop": [{"kind": "forward", "model": "a"}, {"kind": "backward", "model": "b"}]})
    rep = simulate(s)
    assert rep.outcome == "error"
    assert "loop[1]: backward without a forward" in rep.ranks[0].error.message


def test_objects_on_a_group_exist_only_on_its_ranks():
    s = load_scenario(SCENARIOS / "subgroup_join_zero_counter.toml")
    outside = list(rank_actions(s, 2))
    assert not any(isinstance(a, (BuildModel, BuildOptimizer, EnterJoin)) for a in outside)
    assert sum(isinstance(a, EndIteration) for a in outside) == 3  # it still runs its loop, doing nothing
    inside = list(rank_actions(s, 0))
    assert next(a for a in inside if isinstance(a, BuildOptimizer)).group == "trainers"
    assert next(a for a in inside if isinstance(a, EnterJoin)).joinables == ("ddp", "zero", "c")
    rep = simulate(s)
    zero = [e for e in rep.ranks[0].trace if e.origin == "zero.step.broadcast_shard"]
    assert {e.group for e in zero} == {"trainers"} and {e.root for e in zero} <= {0, 1}
    init = [e for e in rep.ranks[1].trace if e.origin == "ddp.init.sync_module_states"]
    assert [e.root for e in init] == [0]  # DDP's src=0 is the group's rank 0


def test_ddp_root_is_the_groups_first_rank_as_a_global_rank():
    s = parse_scenario({"world_size": 3, "inputs": {"counts": [1, 1, 1]},
                        "groups": [{"name": "g", "ranks": [2, 1]}], "model": {"params": [2], "group": "g"},
                        "loop": [{"kind": "forward"}, {"kind": "backward"}]})
    rep = simulate(s)
    assert rep.outcome == "completed" and rep.ranks[0].trace == []
    roots = {e.root for r in rep.ranks[1:] for e in r.trace if e.op == "broadcast"}
    assert roots == {1}  # new_group sorts its ranks: group rank 0 is global rank 1


MULTI = """
world_size = 2
colour = "red"
[inputs]
counts = [1, 1]
[[groups]]
name = "g"
ranks = [0, 5]
[[loop]]
kind = "collective"
op = "all_reduce"
group = "evens"
[[loop]]
kind = "compute"
seconds = [0.1, 0.2, 0.3]
[[loop]]
kind = "forward"
every = 4
offset = 4
[[loop]]
kind = "stop"
flag = "nothing"
[[after]]
kind = "stop"
[expect]
inputs_processed = [1]
"""


def test_every_problem_of_a_file_is_reported_at_once_naming_its_field(tmp_scenario):
    p = tmp_scenario(MULTI)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(p)
    lines = str(ei.value).splitlines()
    fields = [ln.split(": ")[1] for ln in lines]
    assert fields == ["colour", "groups[0].ranks", "loop[0].group", "loop[1].seconds", "loop[2].offset",
                      "loop[3].flag", "after[0].kind", "expect.inputs_processed"], lines
    assert all(ln.startswith(f"{p}: ") for ln in lines)
    res = run_cli("check", str(p))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.splitlines() == [f"error: {ln}" for ln in lines]


@pytest.mark.parametrize("step,field,needle", [
    ({"kind": "forward", "model": "nope"}, "loop[0].model", "unknown model 'nope'"),
    ({"kind": "forward"}, "loop[0].model", "name one"),
    ({"kind": "collective", "op": "all_reduce", "not": {"ranks": [9]}}, "loop[0].not.ranks", "rank 9"),
    ({"kind": "collective", "op": "all_reduce", "any": [{"below": 1}, {"offset": 1}]}, "loop[0].any[1].offset",
     "needs every"),
    ({"kind": "collective", "op": "all_reduce", "value": {"when": {"ranks": [7]}}}, "loop[0].value.when.ranks",
     "rank 7"),
    ({"kind": "stop", "flag": "x"}, "loop[0].flag", "no step observes 'x'"),
])
def test_new_constructs_name_the_field(step, field, needle):
    d = {"world_size": 2, "inputs": {"counts": [1, 1]},
         "models": [{"name": "a", "params": [1]}, {"name": "b", "params": [1]}], "loop": [step]}
    with pytest.raises(ScenarioError) as ei:
        parse_scenario(d)
    assert f"<dict>: {field}: " in str(ei.value) and needle in str(ei.value), str(ei.value)


def test_a_flag_needs_a_result_that_is_there_at_once():
    d = {"world_size": 2, "inputs": {"counts": [1, 1]}, "loop": [
        {"kind": "collective", "op": "all_reduce", "async": True, "wait": "end_of_iteration", "observe": "f"},
        {"kind": "stop", "flag": "f"}]}
    with pytest.raises(ScenarioError, match=r"loop\[1\]\.flag: 'f' is observed by an async collective"):
        parse_scenario(d)


def test_zero_needs_parameters_on_every_rank_of_its_group():
    d = {"world_size": 3, "inputs": {"counts": [1, 1, 1]}, "groups": [{"name": "g", "ranks": [0, 1]}],
         "model": {"params": [1], "group": "g"}, "optimizer": {"zero": True, "group": "WORLD"}}
    with pytest.raises(ScenarioError, match=r"optimizer\.group: ranks \[2\] of group 'WORLD' hold none"):
        parse_scenario(d)


def test_new_constructs_round_trip_through_toml():
    for name in ("grad_accum_join", "stop_early_flag", "two_ddp_models", "subgroup_join_zero_counter"):
        s = load_scenario(SCENARIOS / f"{name}.toml")
        assert parse_scenario(scenario_to_dict(s)) == s


def test_schema_is_generated_from_the_model_and_checked_in():
    assert json.loads((ROOT / "docs" / "scenario.schema.json").read_text()) == json_schema(), \
        "docs/scenario.schema.json is stale: run `simdist schema -o docs/scenario.schema.json`"
    res = run_cli("schema")
    assert res.returncode == 0 and json.loads(res.stdout) == json_schema()


def test_every_bundled_scenario_meets_the_schema_and_mistakes_do_not():
    jsonschema = pytest.importorskip("jsonschema")
    import tomllib

    v = jsonschema.Draft202012Validator(json_schema())
    jsonschema.Draft202012Validator.check_schema(json_schema())
    paths = sorted(SCENARIOS.glob("*.toml")) + sorted((ROOT / "tests" / "scenarios_real").glob("*.toml"))
    for p in paths:
        assert [e.message for e in v.iter_errors(tomllib.loads(p.read_text()))] == [], p
    base = {"world_size": 2, "inputs": {"counts": [1, 1]}}
    for bad in ({**base, "colour": 1}, {**base, "world_size": "2"},
                {**base, "loop": [{"kind": "teleport"}]}, {**base, "loop": [{"kind": "compute"}]},
                {**base, "loop": [{"kind": "stop", "every": 0}]}):
        assert list(v.iter_errors(bad)), bad


def test_schema_output_path_mistake_exits_2(tmp_path):
    res = run_cli("schema", "--out", str(tmp_path / "missing" / "s.json"))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert res.stderr.strip().startswith("error: out: folder")


def test_every_toml_block_of_the_scenario_docs_parses_and_whole_scenarios_load():
    import re

    import tomllib

    blocks = re.findall(r"```toml\n(.*?)```", (ROOT / "docs" / "scenarios.md").read_text(), re.S)
    assert len(blocks) >= 6
    for b in blocks:
        data = tomllib.loads(b)
        if "world_size" in data:
            parse_scenario(data)
