"""The CLI as users call it: exit codes, --json report fields, Chrome trace output."""

from __future__ import annotations

import json
import re

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
    names = {e["args"]["name"] for e in tr["traceEvents"] if e["name"] == "process_name"}
    assert names == {"rank 0", "rank 1"}
    ops = [e for e in tr["traceEvents"] if e["ph"] in ("X", "b")]  # blocking calls and async ones
    assert len(ops) == 52 and all(e["dur"] >= 0 for e in ops if e["ph"] == "X")


# --- user text is printed verbatim, never read as Rich markup (issue 16) --------------------------
GLOO_ERROR = ("[/__w/pytorch/pytorch/third_party/gloo/gloo/transport/tcp/pair.cc:553] Connection closed by peer "
              "[127.0.0.1]:58546")


def _squash(text: str) -> str:
    """Text without whitespace and table borders, to find a cell's content across folded lines."""
    return re.sub(r"[\s│┃]", "", text)


def test_report_with_a_gloo_error_prints_verbatim(capsys):
    """The table and notes of a real lost-peer run: Gloo's `[/path:line]` is a closing tag to Rich."""
    from simdist.cli.scenario import print_report
    from simdist.report import RankError, RankResult, Report

    report = Report(scenario="s[/x]", source="real", outcome="error", backend="gloo", world_size=2,
                    ranks=[RankResult(rank=0, status="completed", inputs_processed=5),
                           RankResult(rank=1, status="error", inputs_processed=5,
                                      error=RankError("RuntimeError", GLOO_ERROR, "peer_lost"))],
                    notes=[f"note {GLOO_ERROR}", "[bold]not bold[/bold]"])
    print_report(report)
    text = capsys.readouterr().out
    assert "s[/x] (real)" in text
    assert _squash(GLOO_ERROR) in _squash(text)  # the table folds long cells over lines
    assert f"note {GLOO_ERROR}" in text and "[bold]not bold[/bold]" in text


def test_names_and_paths_with_markup_print_verbatim(tmp_scenario, tmp_path):
    p = tmp_scenario("name = '[red]n[/]'\nworld_size = 2\n[inputs]\ncounts = [1, 1]\n"
                     "[[loop]]\nkind = 'collective'\nop = 'all_reduce'\n")
    res = run_cli("run", str(p))
    assert res.returncode == 0, res.stdout + res.stderr
    assert "[red]n[/] (sim)" in res.stdout
    res = run_cli("run", str(tmp_path / "missing[/x].toml"))
    assert res.returncode == 2 and "missing[/x].toml" in res.stderr and "Traceback" not in res.stderr
    t = tmp_path / "t.toml"
    t.write_text("name = '[bold]tpl'\nworld_size = { range = [2, 3] }\n[inputs]\nbase = 2\n"
                 "[[loop]]\nkind = 'collective'\nop = 'all_reduce'\n")
    res = run_cli("fuzz", str(t), "--budget", "3", "--no-db", "--out", str(tmp_path / "f"))
    assert res.returncode == 0, res.stdout + res.stderr  # equal inputs: nothing to find
    assert "[bold]tpl" in res.stdout

# The same for the real reports of every bundled scenario (`simdist real` prints them with the
# same function): tests/test_fidelity.py.
