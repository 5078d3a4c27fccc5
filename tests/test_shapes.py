"""What the fuzzer works out once per scenario shape (`simdist.program.shapes.ShapeMemo`: the rank
programs' set-up and loop bodies, the operation budget, the compression plan's periodicity)
and the fuzzer's cheaper pass test (`check.classify.passes`) give exactly what working it all
out afresh gives.

Each bundled template is instantiated at random, every instance through one `Validator` (as the
fuzzer does: the instances share every field object but the inputs, so the memos hit) and
through `parse_scenario` alone (no field shared with any other scenario: the memos miss); the
two must give the same rank programs, budget, plan, report and verdict, and the compressed
runs the same `passes_compressed` answer as `check_run`'s verdict. The memo must have been
hit, so the test cannot pass vacuously.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest

from simdist.check.classify import check_run, passes
from simdist.errors import ScenarioError
from simdist.fuzz.checker import Checker
from simdist.fuzz.compress import apply, passes_compressed, plan, untrusted
from simdist.fuzz.strategies import Validator
from simdist.fuzz.template import load_template
from simdist.program import interpret
from simdist.program.budget import estimate
from simdist.program.shapes import ShapeMemo
from simdist.scenario import Scenario, load_scenario, parse_scenario
from simdist.sim import simulate
from tests.conftest import ROOT
from tests.test_fuzz_verdicts import TEMPLATES, RandomChooser, widened

SCENARIOS = sorted(ROOT.glob("scenarios/*.toml"))
FIELDS = tuple(Scenario.model_fields)


def _programs(s) -> list[list]:
    return [list(interpret.rank_actions(s, r)) for r in range(s.world_size)]


def test_shape_memo_keys_on_the_fields_but_the_inputs() -> None:
    d = load_template(ROOT / "scenarios/templates/ok_ddp_zero_join.toml").instantiate(RandomChooser(random.Random(1)))
    validate = Validator("t")
    shared = [validate(d | {"inputs": {"counts": [k + r for r in range(d["world_size"])]}}) for k in range(3)]
    memo = ShapeMemo()
    made: list[int] = []

    def make() -> int:
        made.append(1)
        return len(made)

    for s in shared:  # one shape (the inputs differ): worked out once
        assert memo.get(s, "x", make) == 1
    assert memo.get(shared[0], "y", make) == 2  # another question
    assert memo.get(parse_scenario(d), "x", make) == 3  # equal fields, but not the same objects
    assert memo.get(shared[0].model_copy(update={"name": "other"}), "x", make) == 4


def _variants(d: dict, rng: random.Random) -> list[dict]:
    """`d`, and `d` with other input counts (its other fields as they are: one shape)."""
    n = d["world_size"]
    return [d] + [d | {"inputs": {"counts": [rng.randint(0, 24) for _ in range(n)]}} for _ in range(2)]


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_per_shape_work_equals_fresh_work(path: Path) -> None:
    t = widened(path)
    rng = random.Random(f"shapes/{path.stem}")
    validate = Validator("t")
    hits = done = 0
    for _ in range(8):
        first = None
        for d in _variants(t.instantiate(RandomChooser(rng)), rng):
            try:
                fresh = parse_scenario(d, source="t")
            except ScenarioError:
                continue
            s = validate(d)
            first = first or s
            hits += s is not first and all(getattr(s, k) is getattr(first, k) for k in FIELDS if k != "inputs")
            done += 1
            _same(t, d, s, fresh)
    assert done >= 12 and hits >= 4, (done, hits)


def _same(t, d: dict, s, fresh) -> None:
    """`s` (through the memos) and `fresh` (parsed alone) give the same programs, budget, plan,
    reports and verdicts."""
    assert _programs(s) == _programs(fresh), d
    assert estimate(s) == estimate(fresh), d
    p = plan(s)
    assert p == plan(fresh), d
    pairs = [(s, fresh)] + ([(apply(s, p), apply(fresh, p))] if p.compressed else [])
    for x, y in pairs:
        report, again = simulate(x), simulate(y)
        assert report.to_json() == again.to_json(), d
        assert passes(report, x, invariants=t.invariants) == (not check_run(again, y, invariants=t.invariants).failed)
    if p.compressed:
        report = simulate(apply(fresh, p))
        expected = not untrusted(p, report) and not check_run(report, apply(fresh, p), invariants=t.invariants).failed
        assert passes_compressed(s, p, invariants=t.invariants) == expected, d


@pytest.mark.parametrize("path", SCENARIOS, ids=lambda p: p.stem)
def test_passes_is_check_runs_verdict(path: Path) -> None:
    """Failing and passing runs alike: hangs, errors, aborts, findings, broken invariants."""
    s = load_scenario(path)
    report = simulate(s)
    for invariants in (True, False):
        assert passes(report, s, invariants=invariants) == (not check_run(report, s, invariants=invariants).failed)


def test_shape_memo_misses_when_any_field_but_the_inputs_is_another_object() -> None:
    """A scenario sharing every field object but one with a memoised scenario is another shape
    (`model_copy(update=...)` shares the fields it does not replace): a key that left a field
    out would hand it the other scenario's rank programs or budget."""
    d = load_template(ROOT / "scenarios/templates/ok_ddp_zero_join.toml").instantiate(RandomChooser(random.Random(1)))
    s = Validator("t")(d)
    memo = ShapeMemo()
    memo.get(s, "x", lambda: "s")
    replaced = []
    for name in FIELDS:
        value = copy.deepcopy(getattr(s, name))
        if name == "inputs" or value is getattr(s, name):  # (None, small ints: the same object, the same shape)
            continue
        assert memo.get(s.model_copy(update={name: value}), "x", lambda name=name: name) == name, name
        replaced.append(name)
    assert {"loop", "after", "topology", "model", "models", "optimizer", "joinables", "groups", "join"} <= set(replaced)
    assert memo.get(s.model_copy(update={"inputs": copy.deepcopy(s.inputs)}), "x", lambda: "miss") == "s"


# Runs that complete yet fail: by an engine finding (mixed reduce ops: Gloo completes them), by a
# broken invariant (an async all-reduce never waited on). `passes` must not take them for passes.
COMPLETED_BUT_FAILED = {
    "engine_finding": {"world_size": 2, "inputs": {"counts": [1, 1]}, "loop": [
        {"kind": "collective", "op": "all_reduce", "reduce_op": "sum", "ranks": [0]},
        {"kind": "collective", "op": "all_reduce", "reduce_op": "max", "ranks": [1]}]},
    "broken_invariant": {"world_size": 2, "on_finish": "stay", "inputs": {"counts": [1, 1]}, "loop": [
        {"kind": "collective", "op": "all_reduce", "async": True, "wait": "never", "ranks": [0]}]},
}


@pytest.mark.parametrize("name", COMPLETED_BUT_FAILED)
def test_passes_on_completed_runs_that_fail(name: str) -> None:
    s = parse_scenario(COMPLETED_BUT_FAILED[name])
    report = simulate(s)
    assert report.outcome == "completed" and check_run(report, s).failed
    assert (name == "engine_finding") == bool(report.findings)
    for invariants in (True, False):
        assert passes(report, s, invariants=invariants) == (not check_run(report, s, invariants=invariants).failed)


def test_checker_cost_models_by_identity_stay_bounded() -> None:
    """The checker finds a scenario's cost model by its topology object's identity, holding
    the object; the shrinker parses every candidate afresh (a topology object each), so the
    entries must be bounded, not one kept per schedule checked."""
    path = ROOT / "scenarios/templates/ok_ddp_zero_join.toml"
    checker = Checker(load_template(path))
    d = checker.template.instantiate(RandomChooser(random.Random(1)))
    n = checker.COST_OF_KEEP + 50
    scenarios = [parse_scenario(d) for _ in range(n)]
    assert len({id(s.topology) for s in scenarios}) == n  # no two share a topology object
    costs = {id(checker.cost(s)) for s in scenarios}
    assert len(costs) == 1 and len(checker._cost_of) <= checker.COST_OF_KEEP
    assert checker.cost(scenarios[-1]) is checker.cost(scenarios[-1])
