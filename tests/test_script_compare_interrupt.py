"""`simdist compare` of a script whose ranks wait in init: the simulated side's status lines,
named by side, and Ctrl-C: each side's report as it stood, the comparison not made, every
process of both sides ended (`simdist.script.api.compare_script`'s `status`)."""

from __future__ import annotations

import os
import signal
import threading

import pytest

from simdist.script import initwatch
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT

SPAWN = ROOT / "tests" / "scripts" / "spawn_rank_missing.py"


def _compare(script_zygote, args: list[str], status, run_id: str):
    return compare_script(SPAWN, args, nproc_per_node=None, backend="gloo", run_id=run_id, measure_compute=False,
                          timeout_s=60, hang_after_s=0.3, zygotes=script_zygote, status=status)


def test_compare_says_the_simulated_sides_status_and_ctrl_c_there_reports_it(script_zygote, monkeypatch):
    """Rank 2 sleeps before its init (it may come: no verdict): the status line comes, named
    as the simulated side's; Ctrl-C then (raised where a terminal's lands: in the serving
    loop) ends the comparison with the simulated side's report as it stood, no real side."""
    monkeypatch.setattr(initwatch, "STATUS_AFTER_S", 0.3)
    lines: list[str] = []

    def status(line: str) -> None:
        lines.append(line)
        raise KeyboardInterrupt

    run_id = new_run_id()
    both = _compare(script_zygote, ["sleeps60", "2", "3", "none", "fork"], status, run_id)
    assert tagged_processes(run_id) == []
    assert lines and lines[0].startswith("init: simulated side: waiting ") and "rank(s) [2] never came" in lines[0], lines
    assert both.interrupted and both.sim.interrupted and both.real is None
    assert [r.status for r in both.sim.report.ranks[:2]] != ["completed", "completed"], both.sim.report.ranks


def test_ctrl_c_on_the_real_side_keeps_the_simulated_report(script_zygote):
    """The simulated side finished; Ctrl-C while the real side's ranks wait for rank 2: the
    simulated report stands, the real side's is as it stood (or none, had no rank come yet)."""
    lines: list[str] = []
    run_id = new_run_id()
    real_started = threading.Event()

    def zygotes(mode: str):
        if mode == "gloo":
            real_started.set()
            threading.Timer(1.0, os.kill, (os.getpid(), signal.SIGINT)).start()
        return script_zygote(mode)

    both = compare_script(SPAWN, ["sleeps2.5", "2", "3", "none", "fork"], nproc_per_node=None, backend="gloo",
                          run_id=run_id, measure_compute=False, timeout_s=60, hang_after_s=0.3, zygotes=zygotes,
                          status=lines.append)
    assert real_started.is_set() and tagged_processes(run_id) == []
    assert both.sim.report.outcome == "completed" and not both.sim.interrupted, both.sim.report.notes
    assert both.interrupted and (both.real is None or both.real.interrupted)


@pytest.mark.slow
def test_cli_compare_ctrl_c_prints_each_sides_report_and_exits_130():
    """The CLI: the simulated side's status line on stderr, then Ctrl-C: the simulated side's
    report as it stood, the real side never started, exit 130, no process of the run left."""
    import subprocess
    import sys
    import uuid

    from simdist.procs import processes_with_env
    from tests.conftest import TEST_TAG

    tag = uuid.uuid4().hex
    p = subprocess.Popen([sys.executable, "-m", "simdist", "compare", str(SPAWN), "--", "sleeps120", "2", "3", "none",
                          "fork"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, TEST_TAG: tag})
    try:
        status = p.stderr.readline()
        assert status.startswith("init: simulated side: waiting") and "rank(s) [2] never came" in status, status
        p.send_signal(signal.SIGINT)
        out, rest = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, (out[-800:], rest[-800:])
    assert "simulated side: interrupted (Ctrl-C): its report as it stood" in out, out
    assert "rank 0 is waiting in init_process_group" in out and "real side: not run" in out, out
    assert processes_with_env(TEST_TAG, tag) == []
