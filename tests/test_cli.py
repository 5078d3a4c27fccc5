"""The CLI as users call it: exit codes, --json report fields, Chrome trace output."""

from __future__ import annotations

import json

import pytest

from .conftest import SCENARIOS, run_cli


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.stem)
def test_every_bundled_scenario_meets_its_expectations(path):
    res = run_cli("run", str(path))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all expectations met" in res.stdout


def test_json_report_fields(tmp_path):
    res = run_cli("run", str(SCENARIOS / "no_join_hang.toml"), "--json")
    assert res.returncode == 0
    rep = json.loads(res.stdout)
    assert rep["outcome"] == "hang" and rep["source"] == "sim"
    r1 = rep["ranks"][1]
    assert {"rank", "status", "inputs_processed", "error", "observed", "trace"} <= set(r1)
    assert r1["status"] == "hang" and r1["blocked_in"]["origin"] == "ddp.backward.bucket_allreduce"
    e = r1["trace"][0]
    assert {"seq", "op", "numel", "dtype", "group", "origin"} <= set(e)
    assert e["op"] == "all_gather" and e["dtype"] == "int64"


def test_exit_code_1_when_expectation_fails(tmp_scenario):
    p = tmp_scenario("world_size = 2\n[inputs]\ncounts = [1, 2]\n[[loop]]\nkind = 'collective'\nop = 'all_reduce'\n"
                     "[expect]\noutcome = 'completed'\n")
    res = run_cli("run", str(p))
    assert res.returncode == 1
    assert "expectation not met" in res.stdout


def test_exit_code_without_expect_follows_outcome(tmp_scenario):
    ok = tmp_scenario("world_size = 2\n[inputs]\ncounts = [2, 2]\n[[loop]]\nkind = 'collective'\nop = 'all_reduce'\n")
    assert run_cli("run", str(ok)).returncode == 0
    bad = tmp_scenario("world_size = 2\n[inputs]\ncounts = [1, 2]\n[[loop]]\nkind = 'collective'\nop = 'all_reduce'\n",
                       "bad.toml")
    assert run_cli("run", str(bad)).returncode == 1


def test_chrome_trace_has_one_track_per_rank(tmp_path):
    out = tmp_path / "t.json"
    res = run_cli("run", str(SCENARIOS / "ddp_join_uneven.toml"), "--trace-out", str(out))
    assert res.returncode == 0
    tr = json.loads(out.read_text())
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["ph"] == "M"}
    assert names == {"rank 0", "rank 1"}
    spans = [e for e in tr["traceEvents"] if e["ph"] == "X"]
    assert len(spans) == 52 and all(e["dur"] >= 0 for e in spans)
