"""A collective's root posts it and leaves at once (`tests/scripts/rooted_root_exits.py`): on
real Gloo a peer completes it or loses the root by whether its part reached the root before
the root's sockets closed (`simdist.races.TeardownRace`; the counts are in its docstring). The
simulator completes every peer; the comparison with a real run is agreement or that race,
never a model difference. Real Gloo processes beside the simulated ones, world size 2."""

from __future__ import annotations

import pytest

from simdist.cli.reports import Compared
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT, descendants

SCRIPT = ROOT / "tests" / "scripts" / "rooted_root_exits.py"


@pytest.mark.real
@pytest.mark.parametrize("op", ["broadcast", "scatter", "gather", "reduce"])
def test_a_root_that_posts_and_exits_is_agreement_or_a_teardown_race(op, script_zygote, tmp_path):
    run_id = new_run_id()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        both = compare_script(SCRIPT, [op, "async"], nproc_per_node=2, backend="gloo", timeout_s=120, run_id=run_id,
                              measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    sim = both.sim.report
    assert [r.status for r in sim.ranks] == ["error", "completed"] and sim.ranks[1].output[0].startswith(f"[1] {op} ")
    got = Compared.of(sim, both.real.report)
    assert got.verdict in ("agree", "race"), got.cmp.differences
    assert [(r.kind, r.rank, r.op, r.left) for r in got.races] in ([], [("teardown", 1, op, (0,))])
