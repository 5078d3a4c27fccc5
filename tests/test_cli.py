"""The CLI as users call it: exit codes, --json report fields, Chrome trace output."""

from __future__ import annotations

import json
import re

import pytest

from simdist.cli.console import ExitCode

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


# --- exit codes that hold everywhere; output paths; several files (issue 12) ----------------------
def _invoke(*args: str):
    from typer.testing import CliRunner

    from simdist.cli import app

    return CliRunner().invoke(app, list(args))


@pytest.mark.parametrize("path", sorted(SCENARIOS.glob("*.toml")), ids=lambda p: p.stem)
def test_run_and_check_agree_on_the_exit_code(path):
    assert _invoke("run", str(path)).exit_code == _invoke("check", str(path)).exit_code == 0


def test_run_and_check_agree_without_expect(tmp_scenario):
    hang = tmp_scenario("world_size = 2\non_finish = 'stay'\n[inputs]\ncounts = [1, 2]\n[[loop]]\nkind = 'collective'\n"
                        "op = 'all_reduce'\n")
    # completes, but rank 0's async all_reduce is never waited on and issued on rank 0 only: an invariant breaks
    broken = tmp_scenario("world_size = 2\n[inputs]\ncounts = [1, 1]\n[[loop]]\nkind = 'collective'\nop = 'all_reduce'\n"
                          "async = true\nwait = 'never'\nranks = [0]\n", "broken.toml")
    for p in (hang, broken):
        assert _invoke("run", str(p)).exit_code == _invoke("check", str(p)).exit_code == 1


def test_output_path_mistakes_are_bad_usage(tmp_path):
    s = str(SCENARIOS / "no_join_hang.toml")
    for args in (["run", s, "--trace-out", "missing/dir/t.json"], ["run", s, "--trace-out", str(tmp_path)],
                 ["check", s, "--graph", str(tmp_path / "nope" / "wf.dot")], ["check", s, "--graph", str(tmp_path)],
                 ["check", s, "--graph", str(tmp_path / "wf.jpg")],
                 ["explain", "all_reduce", "--trace", str(tmp_path / "no" / "t.json")],
                 ["run", s, s, "--trace-out", str(tmp_path / "one.json")]):
        res = run_cli(*args)
        assert res.returncode == 2, (args, res.stdout, res.stderr)
        assert "internal error" not in res.stderr and "Traceback" not in res.stderr
        assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
        assert res.stdout == ""  # checked before anything ran


def test_check_writes_dot(tmp_path):
    res = run_cli("check", str(SCENARIOS / "no_join_hang.toml"), "--graph", str(tmp_path / "wf.dot"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "wf.dot").read_text().startswith("strict digraph")


def test_a_late_write_failure_still_prints_the_report(monkeypatch, tmp_path):
    import simdist.cli.scenario as cli_scenario

    def broken(report, path):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(cli_scenario, "write_chrome_trace", broken)
    res = _invoke("run", str(SCENARIOS / "no_join_hang.toml"), "--trace-out", str(tmp_path / "t.json"))
    assert res.exit_code == 2
    assert "no_join_hang (sim)" in res.output and "outcome: hang" in res.output  # the results are not lost
    assert "trace-out: cannot write" in res.output and "No space left on device" in res.output


def test_several_files_summary_and_worst_exit_code(tmp_path, tmp_scenario):
    failing = tmp_scenario("world_size = 2\non_finish = 'stay'\n[inputs]\ncounts = [1, 2]\n[[loop]]\n"
                           "kind = 'collective'\nop = 'all_reduce'\n")
    ok = str(SCENARIOS / "ddp_join_uneven.toml")
    res = run_cli("run", ok, str(failing))
    assert res.returncode == 1 and "summary: 2 files: 1 passed, 1 failed, 0 bad input (exit 1)" in res.stdout
    res = run_cli("check", ok, str(failing), str(tmp_path / "missing.toml"), "--graph", str(tmp_path))
    assert res.returncode == 2 and "1 passed, 1 failed, 1 bad input (exit 2)" in res.stdout
    assert (tmp_path / "ddp_join_uneven.dot").exists() and (tmp_path / "s.dot").exists()
    res = run_cli("run", ok, str(failing), "--json", "--trace-out", str(tmp_path / "{name}-trace.json"))
    d = json.loads(res.stdout)
    assert d["exit_code"] == 1 and [f["exit_code"] for f in d["files"]] == [0, 1]
    assert d["files"][0]["report"]["scenario"] == "ddp_join_uneven"
    assert (tmp_path / "ddp_join_uneven-trace.json").exists() and (tmp_path / "s-trace.json").exists()


def test_version_help_and_completion():
    from simdist import __version__

    res = run_cli("--version")
    assert res.returncode == 0 and res.stdout.strip() == f"simdist {__version__}"
    res = run_cli("-h")
    assert res.returncode == 0 and "--show-completion" in res.stdout and "Exit codes" in res.stdout
    said = " ".join(res.stdout.split())  # every code a command can end with, compare's race (4) included
    assert all(f"{int(c)} " in said for c in ExitCode), said
    res = run_cli("run", "-h")
    assert res.returncode == 0 and "--trace-out" in res.stdout
    res = run_cli("fuzz", "--help")
    assert "[fuzz].budget" in res.stdout and "[fuzz].expect" in " ".join(res.stdout.split())  # markup not eaten


def test_plain_output_when_piped():
    """No box drawing, no wrapping at 80 columns: each note is one line, as long as it is."""
    res = run_cli("check", str(SCENARIOS / "no_join_hang.toml"))
    assert not set("┃│━─┏┗") & set(res.stdout)
    res = run_cli("run", str(SCENARIOS / "no_join_hang.toml"))
    assert not set("┃│━─┏┗") & set(res.stdout)
    row = next(line for line in res.stdout.splitlines() if line.lstrip().startswith("1 "))
    assert "blocked in #11 all_reduce[2] float32 group=WORLD (ddp.backward.bucket_allreduce)" in row
    assert max(len(line) for line in res.stdout.splitlines()) > 120
