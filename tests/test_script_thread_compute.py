"""A rank's compute is measured per thread (`RankConn.advance`, `rank.client.Client.send`'s
`tid`): each message carries its sending thread's `time.thread_time()`, and the coordinator
kept one mark per rank, so after a side thread's collective the main thread's next message
counted its whole CPU since it started (imports, the pre-init compute) as compute: 1.6 s of
simulated time for a script that computes nothing after init
(`simdist run tests/scripts/side_thread_then_main.py --nproc-per-node 2`). The script runs
on both sides (`tests/scripts/side_thread_then_main.py`)."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "scripts" / "side_thread_then_main.py"
BUSY_S = 0.5  # the script's CPU before init (its BUSY_S)


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_a_side_threads_collective_does_not_make_the_main_threads_past_cpu_compute(script_zygote, nproc):
    """Simulated time stays under BUSY_S / 2: after init the main thread computes nothing but
    the patched calls' own Python (milliseconds), while the bug counted at least the BUSY_S of
    CPU it spent before init; the values and each rank's sequence agree with real Gloo."""
    sim, real = _compare(script_zygote, [], nproc)
    total = float(sum(range(1, nproc + 1)))
    _agree_on_values(sim, real, nproc, total, 4)


@pytest.mark.real
def test_a_thread_that_takes_an_ended_threads_ident_starts_its_own_mark(script_zygote):
    """A second side thread, which CPython gives the first's `threading.get_ident()`,
    computes BUSY_S before its collective: its first message only sets its mark, as a new
    thread's does. Keyed by the ident the coordinator measured it against the ended thread's
    mark and counted nearly BUSY_S of simulated compute (0.49 s at 2 ranks)."""
    sim, real = _compare(script_zygote, ["reuse"], 2)
    _agree_on_values(sim, real, 2, 6.0, 5)


def _compare(script_zygote, args: list[str], nproc: int):
    run_id = new_run_id()
    both = compare_script(SCRIPT, args, nproc_per_node=nproc, backend="gloo", run_id=run_id, measure_compute=True,
                          zygotes=script_zygote, timeout_s=60, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    return both.sim.report, both.real.report


def _agree_on_values(sim, real, nproc: int, side: float, ops: int) -> None:
    """Both sides agree, print the sums the script computes and ran `ops` all-reduces; the
    simulated time stays under BUSY_S / 2 (no CPU before a thread's first message counts)."""
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    for rep in (sim, real):
        assert [r.output for r in rep.ranks] == [
            [f"rank {r}: side {side} main {[float(sum(q + i for q in range(nproc))) for i in range(3)]}"]
            for r in range(nproc)], rep.source
        assert [[e.op for e in r.trace] for r in rep.ranks] == [["all_reduce"] * ops] * nproc, rep.source
    assert all(r.time < BUSY_S / 2 for r in sim.ranks), [r.time for r in sim.ranks]
