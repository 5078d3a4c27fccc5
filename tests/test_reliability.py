"""Issue 16, runs: nothing found is lost, every exit code means one thing, nothing is left behind.

The fuzzer's files (confined to --out, written when found, kept on Ctrl-C), exit codes (3 for
a bug, 130 for Ctrl-C at any moment, 141 for a closed pipe), user text printed as text, and
the real backend's timeout, temporary folder and aborts at shutdown. Bad input is in
test_bad_input.py; the store on loopback in test_procs.py and test_real_backend.py.
"""

from __future__ import annotations

import math
import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest
import tomllib

from simdist.errors import InputError
from simdist.fuzz.runner import FuzzInterrupted, fuzz_template
from simdist.fuzz.template import load_template, parse_template
from simdist.limits import check_timeout
from simdist.scenario import load_scenario
from simdist.sim import simulate

from .conftest import ROOT, SCENARIOS, one_line_error, run_cli, scenario_file

TEMPLATES = SCENARIOS / "templates"


# ----------------------------------------------------------------------------- the fuzzer's files
NAMES = ["../../x", "/tmp/abs-name", "a/b", "nul\x00byte", "\U0001F600 emoji", "[/] markup", "..", ""]


@pytest.mark.parametrize("name", NAMES, ids=["dotdot", "absolute", "slash", "nul", "emoji", "markup", "dots", "empty"])
def test_counterexamples_stay_in_out_and_read_back(tmp_path, name):
    t = parse_template({**tomllib.loads((TEMPLATES / "no_join.toml").read_text()), "name": name},
                       source=str(TEMPLATES / "no_join.toml"))
    out = tmp_path / "a" / "b" / "out"
    before = set(tmp_path.rglob("*"))
    res = fuzz_template(t, budget=30, seed=0, out_dir=out, use_db=False)
    assert res.counterexamples
    new = set(tmp_path.rglob("*")) - before
    assert new and all(out in p.parents or p == out or p in out.parents for p in new), new
    for c in res.counterexamples:
        path = Path(c.path)
        assert path.parent == out and path.name.isascii() and not path.name.startswith((".", "-"))
        s = load_scenario(path)  # TOML that reads back, and replays with the same verdict
        assert s.expect is not None and simulate(s).outcome == s.expect.outcome
    assert not list(Path("/tmp").glob("abs-name*"))


def test_an_api_template_with_none_values_writes_a_readable_counterexample(tmp_path):
    d = tomllib.loads((TEMPLATES / "no_join.toml").read_text())
    d["loop"][0]["every"] = None  # the API's "not given"
    res = fuzz_template(parse_template(d, source="api"), budget=30, seed=0, out_dir=tmp_path, use_db=False)
    assert res.counterexamples and all(load_scenario(c.path) for c in res.counterexamples)


def test_a_counterexample_is_on_disk_before_shrinking_ends(tmp_path, monkeypatch):
    import simdist.fuzz.runner as runner

    t = load_template(TEMPLATES / "no_join.toml")
    seen: list[list[str]] = []
    real_greedy = runner.greedy_shrink

    def spy(d, key, checker, **kw):  # the post-shrink starts only after hypothesis's shrinking
        seen.append(sorted(p.name for p in tmp_path.glob("*.toml")))
        return real_greedy(d, key, checker, **kw)

    monkeypatch.setattr(runner, "greedy_shrink", spy)
    res = fuzz_template(t, budget=50, seed=0, out_dir=tmp_path, use_db=False)
    assert seen and seen[0], "no file was written while the search was still shrinking"
    final = sorted(p.name for p in tmp_path.glob("*.toml"))
    assert final == sorted(Path(c.path).name for c in res.counterexamples)  # the unshrunk file was replaced
    assert "shrunk by hypothesis" in Path(res.counterexamples[0].path).read_text()


def test_ctrl_c_during_the_search_writes_what_was_found(tmp_path, monkeypatch):
    import simdist.fuzz.runner as runner

    t = load_template(TEMPLATES / "no_join.toml")

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "greedy_shrink", interrupted)
    with pytest.raises(FuzzInterrupted) as ei:
        fuzz_template(t, budget=50, seed=0, out_dir=tmp_path, use_db=False)
    paths = [c.path for c in ei.value.result.counterexamples]
    assert paths and all(Path(p).exists() for p in paths)
    assert "the search was interrupted (Ctrl-C)" in Path(paths[0]).read_text()
    assert load_scenario(paths[0]).expect is not None


def test_sigint_to_simdist_fuzz_after_a_failure_leaves_the_counterexample(tmp_path):
    """The issue's acceptance test: SIGINT to `simdist fuzz` once a failure is found."""
    text = (TEMPLATES / "no_join.toml").read_text()
    slow = tmp_path / "slow.toml"  # long inputs: shrinking takes seconds, time to interrupt it
    slow.write_text(text.replace("range = [0, 6]", "range = [0, 4000]"))
    assert "4000" in slow.read_text()
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "simdist", "fuzz", str(slow), "--out", str(out), "-n", "100000",
                          "--no-db"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob("*.toml")) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.01)
        assert list(out.glob("*.toml")) and p.poll() is None, "no counterexample while the fuzzer ran"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    files = list(out.glob("*.toml"))
    assert p.returncode == 130 and len(files) == 1, (p.returncode, err)
    assert f"interrupted: counterexample written: {files[0]}" in err and "Traceback" not in err
    assert load_scenario(files[0]).expect is not None


def test_an_unwritable_out_is_bad_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = one_line_error(run_cli("fuzz", str(TEMPLATES / "no_join.toml"), "--out", str(blocker / "out"), "-n", "30",
                                   "--no-db", "-q"))
    assert line == f"error: out: {blocker} is not a folder (for {blocker / 'out'})"  # checked before the search
    # the API does not check first: a write that fails inside the search is still one InputError
    with pytest.raises(InputError, match=r"--out: cannot write counterexamples in .*/file/out \(Not a directory\)"):
        fuzz_template(load_template(TEMPLATES / "no_join.toml"), budget=30, seed=0, out_dir=blocker / "out",
                      use_db=False)


# ----------------------------------------------------------------------------- exit codes
_CRASH = ("import sys, simdist.sim\n"
          "def boom(*a, **k):\n    raise {exc}\n"
          "simdist.sim.simulate = boom\n"
          "sys.argv = ['simdist', 'run', {path!r}]\n"
          "from simdist.cli import main\nmain()\n")


@pytest.mark.parametrize("exc,shown", [
    ("RuntimeError('a bug')", "internal error: RuntimeError: a bug --"),
    ("MemoryError()", "internal error: out of memory"),
    ("EOFError()", "internal error: EOFError --"),
    ("RecursionError('deep')", "internal error: RecursionError: deep --"),
])
def test_a_bug_is_exit_3_with_one_line_saying_where_to_report(exc, shown):
    code = _CRASH.format(exc=exc, path=str(SCENARIOS / "subset_collective.toml"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    line = one_line_error(res, 3)
    assert shown in line and "please report it" in line and "SIMDIST_DEBUG=1" in line
    debug = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                           env={**os.environ, "SIMDIST_DEBUG": "1"})
    assert "Traceback" in debug.stderr


def test_a_closed_output_pipe_is_not_a_failed_check():
    cmd = [sys.executable, "-m", "simdist", "run", "--json", str(SCENARIOS / "ws8_ddp_zero_join.toml")]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.read(10)
    p.stdout.close()  # the reader goes away: `simdist run --json x | head -c 10`
    err = p.stderr.read().decode() if p.stderr else ""
    assert p.wait(timeout=60) == 141 and err == "", err


SIMDIST_SCRIPT = Path(sys.executable).with_name("simdist")  # the installed `simdist` (setup.sh)


def _importing_the_cli(pid: int) -> bool:
    """The process has got as far as importing the CLI (pydantic's compiled core is mapped):
    past the interpreter's own start-up, which no program can make Ctrl-C-safe."""
    try:
        return "pydantic_core" in Path(f"/proc/{pid}/maps").read_text()
    except OSError:
        return False


@pytest.mark.parametrize("cmd,when", [
    ([sys.executable, "-m", "simdist"], "importing"), ([str(SIMDIST_SCRIPT)], "importing"),
    ([sys.executable, "-m", "simdist"], "running"),
], ids=["module-during-start-up", "script-during-start-up", "while-running"])
def test_ctrl_c_is_130_with_a_message(tmp_path, cmd, when):
    p = scenario_file(tmp_path, (SCENARIOS / "ddp_join_uneven.toml").read_text()
                       .replace("counts = [5, 6]", "counts = [100000, 100000]").split("[expect]")[0])
    proc = subprocess.Popen([*cmd, "run", str(p)], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    if when == "importing":  # at once, while the CLI's modules load (seconds under load)
        deadline = time.monotonic() + 30
        while not _importing_the_cli(proc.pid) and time.monotonic() < deadline:
            time.sleep(0.002)
    else:
        time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "interrupted", err


def test_markup_in_names_and_groups_is_printed_as_text(tmp_path):
    p = scenario_file(tmp_path, "name = '[/] [bold]x[/]'\nworld_size = 2\n[inputs]\ncounts = [1, 2]\n"
                                 "[[groups]]\nname = '[/__w/pair.cc:553]'\nranks = [0, 1]\n[[loop]]\nkind = 'collective'\n"
                                 "op = 'all_reduce'\ngroup = '[/__w/pair.cc:553]'\n")
    res = run_cli("run", str(p))
    assert res.returncode == 1 and "Traceback" not in res.stderr and "[/] [bold]x[/]" in res.stdout
    assert "[/__w/pair.cc:553]" in res.stdout


# ----------------------------------------------------------------------------- the real backend
@pytest.mark.parametrize("bad", [-1, 0, math.inf, math.nan, 1e9, True])
def test_timeouts_are_checked(bad):
    with pytest.raises(InputError, match="--timeout: must be a number of seconds above 0"):
        check_timeout(bad)


@pytest.mark.parametrize("bad", ["-1", "0", "inf", "nan"])
@pytest.mark.parametrize("cmd", ["real", "compare", "run-script"])
def test_a_bad_timeout_is_refused_before_starting(cmd, bad):
    """`simdist real`/`compare` (the real backend's watchdog) and `simdist run SCRIPT.py`."""
    target = str(ROOT / "examples" / "join_tutorial_counter.py") if cmd == "run-script" else \
        str(SCENARIOS / "counter_tutorial.toml")
    t = time.monotonic()
    line = one_line_error(run_cli(cmd.removesuffix("-script"), target, f"--timeout={bad}"))
    assert "--timeout: must be a number of seconds above 0 and at most 86400" in line
    assert time.monotonic() - t < 15


def test_the_script_api_checks_its_timeout():
    from simdist.script.api import run_script

    with pytest.raises(InputError, match="timeout_s: must be a number of seconds above 0"):
        run_script(ROOT / "examples" / "join_tutorial_counter.py", timeout_s=-1)


@pytest.mark.real
def test_no_join_exit_from_the_readme_exits_0_with_its_report():
    res = run_cli("real", str(SCENARIOS / "no_join_exit.toml"), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all expectations met" in res.stdout and "Traceback" not in res.stderr
    flat = "".join(res.stdout.replace("│", " ").split())  # the table wraps Gloo's error over lines
    assert re.search(r"\[/__w/pytorch/\S*/pair\.cc:\d+\]Connectionclosedbypeer", flat), res.stdout  # as text


@pytest.mark.real
def test_the_temporary_folder_goes_when_simdist_real_is_sigkilled(tmp_path):
    from .test_real_backend import _processes_mentioning

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    sc = scenario_file(tmp_path, "world_size = 2\ntimeout_s = 120\n[inputs]\ncounts = [1, 1]\n[[loop]]\n"
                                  "kind = 'sleep'\nseconds = 60\n")
    p = subprocess.Popen([sys.executable, "-m", "simdist", "real", str(sc)], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + 120
        run_dir = None
        while time.monotonic() < deadline and run_dir is None:
            dirs = [d for d in tmp.iterdir() if d.name.startswith("simdist-real-") and list(d.glob("rank*.progress"))]
            run_dir = dirs[0] if dirs else None
            time.sleep(0.1)
        assert run_dir is not None, "the run never started"
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and (run_dir.exists() or _processes_mentioning(str(run_dir))):
        time.sleep(0.2)
    assert not run_dir.exists() and not list(tmp.iterdir())
    assert _processes_mentioning(str(run_dir)) == []


@pytest.mark.real
def test_an_abort_at_shutdown_after_the_record_is_not_a_failure(tmp_path, monkeypatch):
    from real_backend.launch import run_real
    from real_backend.worker import FAULT_ENV

    monkeypatch.setenv(FAULT_ENV, "terminate_at_exit")
    s = load_scenario(SCENARIOS / "counter_tutorial.toml", target="real")
    report = run_real(s, workdir=tmp_path / "wd")
    logs = [(tmp_path / "wd" / f"rank{r}.log").read_text() for r in range(2)]
    assert all("terminate called without an active exception" in log for log in logs)  # it did happen
    assert report.outcome == "completed" and [r.status for r in report.ranks] == ["completed", "completed"]
    assert [r.inputs_processed for r in report.ranks] == [5, 6]
    assert sum("ended by SIGABRT after it had finished and written its record" in n for n in report.notes) == 2
