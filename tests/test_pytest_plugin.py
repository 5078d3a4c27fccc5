"""simdist's pytest plugin (entry point pytest11), run as users run it: pytest in a subprocess.

Scenario files with [expect] become items named by the scenario (-k, -x, JUnit XML and
xdist work on them); the `simdist` fixture runs scenarios from tests; docs/testing.md's
worked example passes."""

from __future__ import annotations

import re
import shutil
import subprocess
import sys
import xml.etree.ElementTree as ET
from pathlib import Path

import pytest

from simdist.scenario import load_scenario

from .conftest import ROOT, SCENARIOS


def _pytest(cwd: Path, *args: str, timeout: float = 600) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", *args], cwd=cwd,
                          capture_output=True, text=True, timeout=timeout)


@pytest.fixture
def suite(tmp_path) -> Path:
    """A folder of scenario files: two that pass, one whose expectation fails, one that does
    not load, and three TOML files that are not collected (no [expect], a template, not a scenario)."""
    d = tmp_path / "suite"
    d.mkdir()
    shutil.copy(SCENARIOS / "stop_early_flag.toml", d / "a_flag.toml")
    shutil.copy(SCENARIOS / "two_ddp_models.toml", d / "b_models.toml")
    text = (SCENARIOS / "stop_early_no_flag.toml").read_text().replace('outcome = "error"', 'outcome = "completed"')
    (d / "c_wrong.toml").write_text(text)
    (d / "d_broken.toml").write_text('name = "broken"\nworld_size = 2\n[inputs]\ncounts = [1, 1]\n[[loop]]\n'
                                     'kind = "collective"\nop = "all_reduce"\ngroup = "nope"\nnumel = -1\n'
                                     '[expect]\noutcome = "completed"\n')
    (d / "no_expect.toml").write_text('world_size = 1\n[inputs]\ncounts = [1]\n')
    shutil.copy(SCENARIOS / "templates" / "ok_ddp_join.toml", d / "template.toml")
    (d / "pyproject.toml").write_text('[project]\nname = "x"\n')
    return d


def test_scenarios_are_items_reported_by_name_and_judged_like_simdist_run(suite):
    res = _pytest(suite.parent, "--simdist", "suite", "-v", "-rf")
    out = res.stdout
    assert res.returncode == 1, out + res.stderr
    assert "suite/a_flag.toml::stop_early_flag PASSED" in out
    assert "suite/b_models.toml::two_ddp_models PASSED" in out
    assert "suite/c_wrong.toml::stop_early_no_flag FAILED" in out
    assert "suite/d_broken.toml::broken FAILED" in out
    assert "expectation not met: outcome: expected completed, got error" in out
    assert "loop[0].numel: Input should be greater than or equal to 0" in out  # every problem, naming its field
    items = re.findall(r"^suite/(\S+)::", out, re.M)
    assert sorted(set(items)) == ["a_flag.toml", "b_models.toml", "c_wrong.toml", "d_broken.toml"]
    assert re.search(r"2 failed, 2 passed", out), out


def test_k_x_and_junit_xml_work_on_scenario_items(suite):
    res = _pytest(suite.parent, "--simdist", "suite", "-k", "models or a_flag", "-q")
    assert res.returncode == 0 and "2 passed, 2 deselected" in res.stdout, res.stdout
    res = _pytest(suite.parent, "--simdist", "suite", "-x", "-q")
    assert res.returncode == 1 and "1 failed, 2 passed" in res.stdout, res.stdout  # stopped at c_wrong
    xml = suite.parent / "report.xml"
    _pytest(suite.parent, "--simdist", "suite", f"--junitxml={xml}")
    cases = {c.get("name"): c for c in ET.parse(xml).getroot().iter("testcase")}
    assert set(cases) == {"stop_early_flag", "two_ddp_models", "stop_early_no_flag", "broken"}
    assert cases["stop_early_no_flag"].find("failure") is not None and cases["two_ddp_models"].find("failure") is None


def test_xdist_runs_scenario_items_in_parallel(suite):
    pytest.importorskip("xdist")
    res = _pytest(suite.parent, "--simdist", "suite", "-n", "2", "-q")
    assert res.returncode == 1 and "2 failed, 2 passed" in res.stdout, res.stdout + res.stderr


def test_without_the_option_nothing_is_collected(suite):
    res = _pytest(suite.parent, "suite", "-q")
    assert res.returncode == 5 and "no tests ran" in res.stdout  # pytest's "nothing collected"


def test_every_bundled_scenario_is_an_item_named_by_its_scenario():
    res = _pytest(ROOT, "--simdist", "scenarios/", "-q", "-m", "simdist")
    names = {load_scenario(p).name for p in SCENARIOS.glob("*.toml")}
    assert res.returncode == 0, res.stdout + res.stderr
    assert f"{len(names)} passed" in res.stdout
    listed = _pytest(ROOT, "--simdist", "scenarios/", "--collect-only", "-q").stdout
    assert {m.group(1) for m in re.finditer(r"\.toml::(\S+)", listed)} == names


def test_fixture_and_the_documented_worked_example(tmp_path):
    """docs/testing.md's example (fixture, parametrised overrides, a caught bug, @given over a
    template), run with pytest as a user would."""
    text = (ROOT / "docs" / "testing.md").read_text()
    block = re.search(r"<!-- example: .*? -->\n```python\n(.*?)```", text, re.S)
    assert block is not None
    (tmp_path / "test_grad_accum.py").write_text(block.group(1))
    (tmp_path / "scenarios").symlink_to(SCENARIOS)
    res = _pytest(tmp_path, "-q", "test_grad_accum.py")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "6 passed" in res.stdout


def test_a_failed_check_fails_the_users_test_with_the_explanation(tmp_path):
    (tmp_path / "test_user.py").write_text(
        "def test_uneven_without_join(simdist):\n"
        "    simdist.check({'world_size': 2, 'inputs': {'counts': [1, 2]}, 'on_finish': 'stay',\n"
        "                   'loop': [{'kind': 'collective', 'op': 'all_reduce'}]})\n")
    res = _pytest(tmp_path, "-q", "test_user.py")
    assert res.returncode == 1
    assert "check failed: hang" in res.stdout and "hint (uneven inputs" in res.stdout, res.stdout


@pytest.mark.real
def test_simdist_real_compares_each_item_with_real_gloo(suite):
    res = _pytest(suite.parent, "--simdist", "--simdist-real", "suite", "-k", "a_flag", "-q")
    assert res.returncode == 0 and "1 passed" in res.stdout, res.stdout + res.stderr
