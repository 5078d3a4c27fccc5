"""Sleeps that make a rank late, or not, on real Gloo and the simulator.

`tests/scripts/thread_straggles.py`: rank 1's background thread sleeps, then joins a collective
(or sends) that rank 0 waits in with a shorter Gloo timeout. Real Gloo: rank 0 times out, the
thread's call meets the closed pair. Before, the simulator posted the thread's call at the
rank's clock (the thread's sleep was a wait of its own, the rank's clock left where it was):
both completed. Now an op a thread posts after its sleep is posted at the sleep's end
(`RankConn.advance`), on the simulated clock: deterministic under `--zero-compute`.

`tests/scripts/alarm_sleep.py`: rank 1's `time.sleep(5)` is cut at 1 s by `signal.alarm(1)`
whose handler raises; it then joins an all_reduce rank 0 waits in with a 3 s timeout. Real Gloo:
it completes. Before, the simulator counted the whole sleep (rank 1 at 5 s, rank 0 timed out
at 3 s); now the sleep counts to the signal (`rank.alarms`). A handler that returns lets the
sleep go on: 5 s, rank 0 times out, on both sides."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script, run_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT

SCRIPTS = ROOT / "tests" / "scripts"
TIMED_OUT = "0 raised Timed out waiting 1000ms for recv operation to complete"


def _compare(zygote, script: str, args: list[str]):
    run_id = new_run_id()
    both = compare_script(SCRIPTS / script, args, nproc_per_node=2, backend="gloo", run_id=run_id,
                          measure_compute=False, zygotes=zygote, timeout_s=90, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    return both.sim.report, both.real.report


@pytest.mark.real
@pytest.mark.parametrize("how", ["all_reduce", "send"])
def test_a_thread_that_sleeps_then_posts_makes_its_rank_late(script_zygote, how):
    sim, real = _compare(script_zygote, "thread_straggles.py", [how, "2", "1"])
    for rep in (sim, real):
        assert rep.ranks[0].output == [TIMED_OUT], rep.source
        assert rep.ranks[1].output == ["1 thread's call raised RuntimeError"], rep.source
    assert sim.ranks[1].trace[-1].t_issue == pytest.approx(2.0, abs=1e-3)  # (the thread's sleep end, on the simulated clock)


@pytest.mark.real
def test_a_thread_that_sleeps_less_than_the_timeout_is_in_time(script_zygote):
    sim, real = _compare(script_zygote, "thread_straggles.py", ["all_reduce", "1", "3"])
    for rep in (sim, real):
        assert rep.ranks[0].output == ["0 completed [2.0, 2.0]"], rep.source


def test_the_threads_post_time_is_deterministic_under_zero_compute(script_zygote):
    """Two simulated runs under --zero-compute: the same clocks, the thread's post at 2 s."""
    times = []
    for _ in range(2):
        run_id = new_run_id()
        rep = run_script(SCRIPTS / "thread_straggles.py", ["all_reduce", "2", "1"], nproc_per_node=2, run_id=run_id,
                         measure_compute=False, zygote=script_zygote("sim"), timeout_s=60)
        assert tagged_processes(run_id) == []
        times.append([(e.op, e.t_issue, e.t_done) for r in rep.ranks for e in r.trace])
    assert times[0] == times[1]
    assert times[0][-1][1] == pytest.approx(2.0, abs=1e-3)  # (after the barrier: its cost, 30 us)


@pytest.mark.real
@pytest.mark.parametrize(("how", "lines"), [
    ("raises", [["0 all_reduce [2.0, 2.0]"], ["1 cut at 1", "1 all_reduce [2.0, 2.0]"]]),
    ("returns", [["0 raised RuntimeError"], ["1 slept 5", "1 raised RuntimeError"]]),
])
def test_a_sleep_a_signal_cuts_short_counts_to_the_signal(script_zygote, how, lines):
    sim, real = _compare(script_zygote, "alarm_sleep.py", [how, "5", "3"])
    for rep in (sim, real):
        assert [r.output for r in rep.ranks] == lines, rep.source
