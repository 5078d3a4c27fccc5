"""The script's clocks around a Gloo timeout agree with real Gloo's, on every rank
(`simdist.script.scriptclocks`, `rank.simclock`).

tests/scripts/clocks_after_timeout.py: one rank times out in a recv (2-3 s) while the others
wait for a store key; each prints how long its wait and the time to the key lasted by its
clocks. Before, only the rank whose wait timed out had its clocks moved, and at once: where
every rank was blocked (MODE stuck) the others read 0 s for a wait of 2 s on real Gloo, by a
tqdm-like monitor's wakes too; where a peer slept meanwhile (MODE sleep) the timed-out rank
read the 4 s peer's sleep as 6 s (2 skipped + 4 of wall time), and with a third rank waiting
in the store its timeout fired only when the sleeper woke (4 s, not 2)."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT

pytestmark = pytest.mark.real

SCRIPT = ROOT / "tests" / "scripts" / "clocks_after_timeout.py"


@pytest.mark.parametrize(("args", "nproc", "waited", "keyed"), [
    (["stuck", "2", "0"], 3, "[2, 2, 2]", "[2, 2, 2]"),  # every rank blocked: the skip moves every rank's clocks
    (["stuck", "3", "0", "1"], 2, "[3, 3, 3]", "[3, 3, 3]"),  # ... and so do a monitor thread's wakes
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
