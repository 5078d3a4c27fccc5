"""`simdist.spawn_race` for an mp.spawn child killed by a signal (tests/scripts/selfkill_spawn.py):
it tells no exit, yet mp.spawn's parent SIGTERMs the others at its signal's exit as at an
error, so a peer waiting on it races the same way. The simulated report notes the peer
(`race_notes.spawned_failures`: the child said at init it is mp.spawn's, and its process
was the first silent one to end, before any told failure), and a real run that ended the
other way is that race; before, nothing was noted and a real run could differ (1 of 3)."""

from __future__ import annotations

import pytest

from simdist.report import Report
from simdist.script.api import run_script
from simdist.script.launch import new_run_id, tagged_processes
from simdist.spawn_race import noted_spawn_races
from tests.conftest import ROOT, descendants
from tests.test_script_examples import differences_but_noted_races

pytestmark = pytest.mark.real

SCRIPT = ROOT / "tests" / "scripts" / "selfkill_spawn.py"


def _run(args: list[str], mode: str, zygote) -> Report:
    run_id, z = new_run_id(), zygote(mode)
    report = run_script(SCRIPT, args, nproc_per_node=None, backend="gloo", mode=mode, timeout_s=300,
                        run_id=run_id, measure_compute=False, zygote=z)
    assert tagged_processes(run_id) == [] and descendants(z.pid) == []
    return report


@pytest.mark.parametrize(("signame", "world"), [("SIGKILL", 2), ("SIGSEGV", 2), ("SIGKILL", 3)])
def test_a_child_killed_by_a_signal_notes_its_waiting_peers_and_real_gloo_agrees_up_to_it(script_zygote, signame,
                                                                                        world):
    sim = _run([signame, str(world)], "sim", script_zygote)
    assert sim.ranks[1].error is not None and sim.ranks[1].error.category == "killed", sim.notes
    # every peer waited on rank 1 in its second all_reduce, and only those are noted
    assert noted_spawn_races(sim) == {r: (1, 2, "all_reduce", "WORLD") for r in range(world) if r != 1}, sim.notes
    for _ in range(2):  # either end of the race on real Gloo is no difference
        real = _run([signame, str(world)], "gloo", script_zygote)
        assert real.ranks[1].error is not None and real.ranks[1].error.category == "killed"
        assert differences_but_noted_races(sim, real) == []
