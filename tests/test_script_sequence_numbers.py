"""A simulated Gloo group answers `_get_sequence_number_for_group` as real Gloo does.

Real ProcessGroupGloo counts every operation a rank issues on the group (p2p included, and
each part of an op it runs as several: a list reduce_scatter, monitored_barrier's messages, the
object collectives); the simulated group used to raise torch's "does not yet support sequence
numbers". tests/scripts/sequence_numbers.py prints the group's and its backend's answer after
each kind of op, on the world and on a subgroup, once per rank: both sides print the same."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from tests.conftest import ROOT

pytestmark = pytest.mark.real

SCRIPT = ROOT / "tests" / "scripts" / "sequence_numbers.py"


def _answers(rep) -> list[dict[str, str]]:
    """Per rank: what -> 'group/backend' numbers, from its one printed line."""
    out = []
    for r in rep.ranks:
        line = next(x for x in r.output if x.split(" ", 1)[0].isdigit() and "init=" in x)
        out.append(dict(kv.split("=") for kv in line.split()[1:]))
    return out


@pytest.mark.parametrize("world", [2, 3])
def test_sequence_numbers_agree_with_real_gloo(script_zygote, world):
    both = compare_script(SCRIPT, [], nproc_per_node=world, backend="gloo", timeout_s=120,
                          measure_compute=False, zygotes=script_zygote)
    sim, real = both.sim.report, both.real.report
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * world, (rep.source, rep.notes)
    got, want = _answers(sim), _answers(real)
    assert got == want
    # the rules, as measured: monitored_barrier 2(n-1) on rank 0 and 2 elsewhere; a send and a
    # recv +1 on their two ranks only; a list reduce_scatter + world size; an async op when issued
    assert [a["monitored_barrier"] for a in want] == [f"{2 + 2 * (world - 1)}/{2 + 2 * (world - 1)}"] + ["4/4"] * (world - 1)
    for a, b in zip(("monitored_barrier", "send_recv", "reduce_scatter_tensor"),
                    ("send_recv", "reduce_scatter", "all_gather"), strict=True):
        assert [int(x[b].split("/")[0]) - int(x[a].split("/")[0]) for x in want] == (
            [1, 1] + [0] * (world - 2) if a == "monitored_barrier" else [world] * world if a == "send_recv" else [1] * world)
    assert [a["async_issued"] for a in want] == [a["async_waited"] for a in want]
    assert [a["sub_monitored_barrier"] for a in want[:2]] == ["3/3", "3/3"]
    if world == 2:  # world 3: rank 0's records differ on root/reduce_op metadata, see docs/script-backend.md
        c = compare_reports(sim, real)
        assert c.agree, format_comparison(c)
