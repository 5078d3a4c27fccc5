"""TORCH_DIST_INIT_BARRIER=1: torch 2.13 ends `init_process_group` and `new_group` with a
barrier at the store (`c10d._store_based_barrier`). At init it changes nothing a rank can see
(Gloo's full-mesh connect already waited for the world), but `new_group` without
use_local_synchronization then waits for every rank of the world, non-members too: a rank
that never calls it leaves the members waiting (measured: `new_group_members_only.py`, whose
last rank skips new_group, hangs on real Gloo with the variable set and completes without
it). The simulated ranks each had a store of their own, so every init waited for good."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script, run_script
from simdist.script.barriers import STORE_BARRIER
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT, line_of

SCRIPTS = ROOT / "tests" / "scripts"


def test_init_with_the_store_barrier_completes_in_the_simulator(script_zygote, monkeypatch):
    monkeypatch.setenv("TORCH_DIST_INIT_BARRIER", "1")
    run_id = new_run_id()
    rep = run_script(SCRIPTS / "init_waits_for_world.py", ["joins"], nproc_per_node=3, backend="gloo", run_id=run_id,
                     measure_compute=False, timeout_s=60, zygote=script_zygote("sim"))
    assert tagged_processes(run_id) == []
    assert [r.status for r in rep.ranks] == ["completed"] * 3, rep.notes


@pytest.mark.real
@pytest.mark.parametrize("args", [[], ["first"]])
def test_new_group_waits_for_the_whole_world_with_the_store_barrier_on_both_sides(script_zygote, monkeypatch, args):
    """Ranks 0 and 1 wait in new_group's barrier for the last rank, which goes on to
    dist.barrier() and waits for them: a hang, each rank at its own line, on both sides (real
    Gloo's store wait is not one of torch.distributed's waits its stall rule sees: the
    watchdog ends the real run). `first`: a world barrier before new_group; the simulated
    ranks' store-barrier request carried no claim, so one that had handled a completion
    since its last claim did not count as blocked: the watchdog, "still running"."""
    monkeypatch.setenv("TORCH_DIST_INIT_BARRIER", "1")
    script = SCRIPTS / "new_group_members_only.py"
    run_id = new_run_id()
    both = compare_script(script, args, nproc_per_node=3, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=script_zygote, timeout_s=4, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    sim, real = both.sim.report, both.real.report
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    side, barrier = line_of(script, "dist.new_group("), line_of(script, "dist.barrier()", after="dist.new_group(")
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["hang"] * 3, rep.source
        assert [r.location.line for r in rep.ranks] == [side, side, barrier], rep.source
    assert [r.exit for r in sim.ranks[:2]] == [STORE_BARRIER] * 2
