"""The fuzzer: templates, strategies, the runner (find, shrink, write, replay) and `simdist fuzz`."""

from __future__ import annotations

import json

import pytest
from hypothesis import HealthCheck

from simdist.check.classify import check_run
from simdist.errors import ScenarioError
from simdist.fuzz.counterexample import to_toml
from simdist.fuzz.runner import fuzz_template
from simdist.fuzz.template import Extreme, load_template, parse_template
from simdist.scenario import load_scenario
from simdist.sim import simulate
from tests.conftest import ROOT, run_cli

TEMPLATES = ROOT / "scenarios" / "templates"
FAMILIES = ["no_join", "unshadowed_every_k", "subset_collective", "forward_collective", "no_sync",
            "zero_before_ddp", "join_disabled"]

BASE = {"world_size": {"range": [2, 3]}, "inputs": {"counts": {"each": {"range": [0, 3]}}},
        "loop": [{"kind": "collective", "op": "all_reduce"}]}


def test_every_bundled_template_parses():
    names = {p.stem for p in TEMPLATES.glob("*.toml")}
    assert set(FAMILIES) <= names and any(n.startswith("ok_") for n in names)
    for p in TEMPLATES.glob("*.toml"):
        t = load_template(p)
        assert t.expect == ("ok" if p.stem.startswith("ok_") else "failure")


def test_instantiate_extremes():
    t = parse_template({**BASE, "loop": [{"kind": "collective", "op": {"choice": ["all_reduce", "barrier"]},
                                          "ranks": {"subset": "world"}, "optional": True}]})
    lo, hi = t.instantiate(Extreme(False)), t.instantiate(Extreme(True))
    assert lo["world_size"] == 2 and lo["inputs"]["counts"] == [0, 0] and lo["loop"] == []
    assert hi["world_size"] == 3 and hi["inputs"]["counts"] == [3, 3, 3]
    assert hi["loop"] == [{"kind": "collective", "op": "barrier", "ranks": [0, 1, 2]}]


@pytest.mark.parametrize("patch,msg", [
    ({"inputs": {"counts": {"each": {"range": [5, 1]}}}}, "inputs.counts.each.range: low end 5 is above high end 1"),
    ({"inputs": {"counts": {"each": {"range": [0, 1], "x": 1}}}}, "inputs.counts.each.x: unknown key next to 'range'"),
    ({"world_size": {"choice": []}}, "world_size.choice: needs a non-empty list"),
    ({"world_size": {"each": 2}}, "world_size: can only be a number, a range or a choice"),
    ({"fuzz": {"budget": 0}}, "fuzz.budget: must be >= 1"),
    ({"fuzz": {"bogus": 1}}, "fuzz.bogus: unknown key"),
    ({"expect": {"outcome": "hang"}}, "expect: a template cannot carry [expect]"),
    ({"loop": [{"kind": "collective", "op": "all_reduce", "group": "evens"}]},
     "loop[0].group: unknown group 'evens' (in the template's lowest instance)"),
    ({"world_size": {"range": [0, 2]}}, "world_size: Input should be greater than or equal to 1"),
])
def test_template_errors_are_one_line_and_name_the_field(patch, msg):
    with pytest.raises(ScenarioError) as ei:
        parse_template({**BASE, **patch}, source="t.toml")
    text = str(ei.value)
    assert "\n" not in text and text.startswith("t.toml: ") and msg in text, text


@pytest.mark.parametrize("family", FAMILIES)
def test_family_found_within_200_and_shrunk(family, tmp_path):
    t = load_template(TEMPLATES / f"{family}.toml")
    res = fuzz_template(t, budget=200, seed=0, out_dir=tmp_path, use_db=False)
    assert res.failed and res.counterexamples and res.first_failure_at is not None and res.first_failure_at <= 200
    for c in res.counterexamples:
        assert c.world_size == 2, (family, c)
        assert sum(c.counts) <= 8, (family, c)
        # the written file is a plain scenario that replays to the same verdict, bit for bit
        s = load_scenario(c.path)
        r = simulate(s)
        v = check_run(r, s)
        assert f"{v.kind}/{v.outcome}" == c.key
        assert [x.status for x in r.ranks] == s.expect.status and r.outcome == s.expect.outcome
    assert min(sum(c.counts) for c in res.counterexamples) <= 3
    if family == "no_join":
        assert res.counterexamples[0].counts in ([0, 1], [1, 0], [1, 2], [2, 1])


def test_ok_template_no_false_positive_1000(tmp_path):
    t = load_template(TEMPLATES / "ok_ddp_zero_join.toml")
    res = fuzz_template(t, budget=1000, seed=1, out_dir=tmp_path, use_db=False)
    assert not res.failed and res.schedules >= 900, res.failures
    assert not list(tmp_path.glob("*.toml"))


@pytest.mark.parametrize("name", ["ok_ddp_join", "ok_counter_join"])
def test_other_ok_templates(name, tmp_path):
    res = fuzz_template(load_template(TEMPLATES / f"{name}.toml"), budget=150, seed=2, out_dir=tmp_path, use_db=False)
    assert not res.failed, res.failures


def test_seeded_runs_are_reproducible_and_database_replays(tmp_path):
    t = load_template(TEMPLATES / "zero_before_ddp.toml")
    a = fuzz_template(t, budget=50, seed=7, out_dir=tmp_path / "a", use_db=False)
    b = fuzz_template(t, budget=50, seed=7, out_dir=tmp_path / "b", use_db=False)
    assert [c.path.split("/")[-1] for c in a.counterexamples] == [c.path.split("/")[-1] for c in b.counterexamples]
    db = tmp_path / "db"
    first = fuzz_template(t, budget=50, seed=3, out_dir=tmp_path / "c", db_dir=db)
    again = fuzz_template(t, budget=50, seed=99, out_dir=tmp_path / "c", db_dir=db)
    assert first.failed and again.failed
    assert again.first_failure_at == 1  # the saved counterexample is replayed first


def test_to_toml_roundtrip():
    import tomllib

    d = {"name": "x", "world_size": 2, "inputs": {"counts": [0, 1]}, "join": {"joinables": ["ddp"], "kwargs": {}},
         "loop": [{"kind": "collective", "op": "all_reduce", "async": True, "value": 1.5}]}
    assert tomllib.loads(to_toml(d)) == d


def test_fuzz_cli_exit_codes(tmp_path):
    out = tmp_path / "f"
    p = run_cli("fuzz", "scenarios/templates/no_join.toml", "--budget", "50", "--out", str(out), "--json")
    assert p.returncode == 0, p.stderr  # [fuzz].expect = "failure", and one was found
    d = json.loads(p.stdout)
    ce = d["results"][0]["counterexamples"][0]
    assert d["failed"] and d["as_expected"] and d["seed"] == 0
    assert d["results"][0]["schedules"] > 0 and d["results"][0]["distinct_failures"] >= 1
    # the counterexample replays with `simdist run` (its [expect] is the failing verdict: exit 0)
    assert run_cli("run", ce["path"]).returncode == 0
    p = run_cli("fuzz", "scenarios/templates/ok_counter_join.toml", "-n", "20", "--out", str(out), "-q")
    assert p.returncode == 0, p.stdout + p.stderr
    assert "simdist fuzz (seed 0" in p.stdout and "┃" not in p.stdout  # the seed; plain table when piped
    bad = tmp_path / "bad.toml"
    bad.write_text('world_size = { range = [3, 1] }\n[inputs]\nbase = 1\n')
    p = run_cli("fuzz", str(bad))
    assert p.returncode == 2 and p.stderr.strip().count("\n") == 0
    assert "world_size.range: low end 3 is above high end 1" in p.stderr


def test_fuzz_exit_code_follows_the_templates_expect(tmp_path):
    """0 when the search ends as [fuzz].expect says, 1 when not: a family template that finds
    nothing, or a correct-loop template (or one without expect) that finds a failure."""
    body = ("world_size = 2\non_finish = 'stay'\n[inputs]\ncounts = {{ each = {{ range = [{lo}, 3] }} }}\n"
            "[[loop]]\nkind = 'collective'\nop = 'all_reduce'\n")
    cases = [("failure", 3, 1), ("failure", 0, 0), ("ok", 0, 1), ("ok", 3, 0), (None, 0, 1)]
    for expect, lo, code in cases:
        t = tmp_path / f"t_{expect}_{lo}.toml"
        head = f"[fuzz]\nexpect = '{expect}'\n" if expect else ""
        t.write_text(f"name = 't'\n{body.format(lo=lo)}{head}")
        p = run_cli("fuzz", str(t), "-n", "30", "--no-db", "--out", str(tmp_path / "f"), "-q")
        assert p.returncode == code, (expect, lo, p.stdout + p.stderr)


def test_fuzzer_uses_public_hypothesis_api_only():
    import inspect

    import simdist.fuzz.runner as runner

    for path in (ROOT / "simdist" / "fuzz").glob("*.py"):  # the shards' search and its database too
        assert "_hypothesis_internal" not in path.read_text(), path
    assert "_hypothesis_internal" not in inspect.getsource(runner)
    assert runner.SUPPRESSED_HEALTH_CHECKS == [HealthCheck.filter_too_much]


def test_fuzz_output_folder_that_is_a_file_is_bad_usage(tmp_path):
    f = tmp_path / "file"
    f.write_text("")
    p = run_cli("fuzz", "scenarios/templates/no_join.toml", "-n", "5", "--out", str(f / "sub"))
    assert p.returncode == 2 and "out:" in p.stderr and "Traceback" not in p.stderr


def test_the_documented_given_example_runs(tmp_path):
    """docs/fuzzing.md's `template_scenarios` example, run with pytest as a user would."""
    import re
    import subprocess
    import sys

    from .conftest import ROOT

    text = (ROOT / "docs" / "fuzzing.md").read_text()
    block = re.search(r"<!-- example: .*? -->\n```python\n(.*?)```", text, re.S)
    assert block is not None
    (tmp_path / "test_my_loop.py").write_text(block.group(1))
    (tmp_path / "scenarios").symlink_to(ROOT / "scenarios")
    res = subprocess.run([sys.executable, "-m", "pytest", "-q", "-p", "no:cacheprovider", "test_my_loop.py"],
                         cwd=tmp_path, capture_output=True, text=True, timeout=600)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "2 passed" in res.stdout
