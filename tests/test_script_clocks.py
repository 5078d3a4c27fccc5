"""The script's clocks around a Gloo timeout agree with real Gloo's, on every rank
(`simdist.script.scriptclocks`, `rank.simclock`).

tests/scripts/clocks_after_timeout.py: one rank times out in a recv (2-3 s) while the others
wait for a store key; each prints how long its wait and the time to the key lasted by its
clocks. Before, only the rank whose wait timed out had its clocks moved, and at once: where
every rank was blocked (MODE stuck) the others read 0 s for a wait of 2 s on real Gloo, by a
tqdm-like monitor's wakes too; where a peer slept meanwhile (MODE sleep) the timed-out rank
read the 4 s peer's sleep as 6 s (2 skipped + 4 of wall time), and with a third rank waiting
in the store its timeout fired only when the sleeper woke (4 s, not 2). datetime.now (read in C)
was not moved at all: it read 0 s for those 2 s (`rank.simclock._calendar`).

tests/scripts/main_sleeps_timeout.py: rank 0's main thread straggles in a `time.sleep`, then
polls in a `time.sleep` loop while the others' recvs from it time out."""

from __future__ import annotations

import re
import subprocess

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script, run_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT

pytestmark = pytest.mark.real

SCRIPT = ROOT / "tests" / "scripts" / "clocks_after_timeout.py"
MAIN_SLEEPS = ROOT / "tests" / "scripts" / "main_sleeps_timeout.py"


@pytest.mark.parametrize(("args", "nproc", "waited", "keyed"), [
    (["stuck", "2", "0"], 3, "[2, 2, 2, 2]", "[2, 2, 2, 2]"),  # every rank blocked: the skip moves every rank's clocks
    (["stuck", "3", "0", "1"], 2, "[3, 3, 3, 3]", "[3, 3, 3, 3]"),  # ... and so do a monitor thread's wakes
    (["sleep", "2", "4"], 2, "[2, 2, 2, 2]", "[4, 4, 4, 4]"),  # a peer sleeps: the timeout waits for the wall clock
    (["sleep", "2", "4"], 3, "[2, 2, 2, 2]", "[4, 4, 4, 4]"),  # ... with a rank blocked in a store request too
])
def test_every_ranks_clocks_read_the_timeout_as_real_gloos(script_zygote, args, nproc, waited, keyed):
    run_id = new_run_id()
    both = compare_script(SCRIPT, args, nproc_per_node=nproc, backend="gloo", timeout_s=120, hang_after_s=3.0,
                          run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == []
    who = 0 if args[0] == "stuck" else 1
    limit = int(args[1]) * 1000
    for rep in (both.sim.report, both.real.report):
        for r in rep.ranks:
            timed_out = [f"{r.rank} timed out after {waited} Timed out waiting {limit}ms for recv operation to complete"]
            assert r.output == (timed_out if r.rank == who else []) + [f"{r.rank} had the key after {keyed}"], \
                (rep.source, r.output, rep.notes)
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)


def _main_sleeps_said(nproc: int, polled: int, limit: int) -> list[list[str]]:
    """main_sleeps_timeout.py's lines (STRAGGLE 2) where the waits time out after `limit` s."""
    agree = f"calendar clocks read time.time: {[True] * 9}"
    raised = f"raised after {[limit] * 4} Timed out waiting {limit * 1000}ms for recv operation to complete"
    return [[f"{r} all_reduce after [2, 2, 2, 2]", f"{r} {f'stopped polling after {[polled] * 4}' if r == 0 else raised}",
             f"{r} {agree}"] for r in range(nproc)]


def test_a_main_thread_sleeping_is_a_timed_wait_as_the_wall_clock_reads_it(script_zygote):
    """Rank 0's main thread sleeps 2 s before an all_reduce, then polls in a `time.sleep(0.5)`
    loop while the others' recvs from it time out after 3 s: both sides print the same lines
    (every rank's clocks, datetime.now's too, read the 2 s straggle and the 3 s timeout; the
    calendar clocks agree with time.time). With torch's default timeout and a 10 s poll, the
    simulated ranks print the same at 1800 s in seconds of wall time: the main thread's sleeps
    are timed waits the coordinator ends in simulated time once every other rank is blocked.
    Before, the sleeps ran in wall time: the run sat until the watchdog, a hang."""
    run_id = new_run_id()
    both = compare_script(MAIN_SLEEPS, ["2", "0.5", "3"], nproc_per_node=3, backend="gloo", timeout_s=120,
                          hang_after_s=3.0, run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == []
    for rep in (both.sim.report, both.real.report):
        assert [r.output for r in rep.ranks] == _main_sleeps_said(3, 4, 3), (rep.source, rep.notes)
        assert [r.status for r in rep.ranks] == ["completed"] * 3, (rep.source, rep.notes)
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    run_id = new_run_id()
    rep = run_script(MAIN_SLEEPS, ["2", "10", "0"], nproc_per_node=3, backend="gloo", timeout_s=120, run_id=run_id,
                     measure_compute=False, zygote=script_zygote("sim"), stdout=subprocess.DEVNULL)
    assert tagged_processes(run_id) == []
    assert [r.output for r in rep.ranks] == _main_sleeps_said(3, 1810, 1800), rep.notes
    assert rep.timings["wall_s"] < 60, rep.timings  # (measured 23 s: the last 10 s sleep runs in wall time)


def test_a_rank_computing_between_operations_moves_no_blocked_peers_clock(script_zygote):
    """Rank 1 computes 0.6 s of CPU between reading its clocks and its recv (SPIN), under
    --zero-compute: on real Gloo rank 2's recv still times out 3 s after its own post, and it
    reads 3 s; so must the simulated rank 2. Before, the stand-still's skips moved every rank's
    script clock by the same amount, and the wall time rank 1 ran (0 s of simulated time)
    stayed on rank 2's: it read [4, 4, 4, 4] (`ScriptClocksMixin._anchored`; CI at load 15 hit
    the same with no SPIN, rank 0's poll turns adding up to 0.5 s). Rank 1 itself reads its
    own compute, as on real Gloo (whole seconds, how many depends on the host's load)."""
    run_id = new_run_id()
    both = compare_script(MAIN_SLEEPS, ["2", "0.5", "3", "0.6"], nproc_per_node=3, backend="gloo", timeout_s=120,
                          hang_after_s=3.0, run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == []
    said = _main_sleeps_said(3, 4, 3)
    for rep in (both.sim.report, both.real.report):
        out = [r.output for r in rep.ranks]
        assert [out[0], out[2]] == [said[0], said[2]], (rep.source, out, rep.notes)
        # (rank 1's recv times out, or on real Gloo meets rank 0's exit where its spin took 1 s or more of wall time)
        line = re.match(r"1 raised after \[(\d+), (\d+), (\d+), (\d+)\] ", out[1][1])
        assert line is not None and min(int(n) for n in line.groups()) >= 4, (rep.source, out[1])


STORE_WAITS = ROOT / "tests" / "scripts" / "store_wait_clocks.py"


@pytest.mark.parametrize(("mode", "said"), [
    ("group", [["0 recv [1.0] after [2, 2, 2, 2]"], ["1 new_group raised after [2, 2, 2, 2] DistStoreError: wait timeout "
                                                     "after 2000ms, keys: /default_pg/0//1//cpu//0/0"]]),
    ("init", [["0 init raised after [2, 2, 2, 2] DistStoreError: wait timeout after 2000ms, keys: /default_pg/0//cpu//0/1"],
              []]),
])
def test_a_store_wait_that_times_out_moves_the_clocks_as_real_gloos(script_zygote, mode, said):
    """A new_group whose member never comes times out after 2 s while its peer waits in a recv:
    the simulator ends the wait at once (every rank blocked), and every rank's clocks, datetime
    too, read the 2 s (`groups._group_failed`); before, the skip moved no clock: both ranks read
    0 s. So does an init whose peer's process ended before its own, where the coordinator ends
    it at once (`rendezvous._init_failed`; its wall-clock path read 2 s before too)."""
    run_id = new_run_id()
    both = compare_script(STORE_WAITS, [mode, "2"], nproc_per_node=2, backend="gloo", timeout_s=120,
                          hang_after_s=3.0, run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == []
    for rep in (both.sim.report, both.real.report):
        assert [r.output for r in rep.ranks] == said, (rep.source, rep.notes)
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
