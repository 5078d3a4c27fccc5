"""`new_group(ranks, sort_ranks=False)` keeps the given order on real torch: group rank i is
ranks[i], so all_gather's and gather's lists, the group rank a rank has, roots given as group
ranks (broadcast's and scatter's `group_src`, gather's `group_dst`, a send's `group_dst`) and
the member a group timeout names in the store's key follow it. The simulator sorted the
members (`GroupsMixin._group`, `Engine.add_group`): an all_gather on [1, 0] gave [0.0, 1.0]
where real Gloo gives [1.0, 0.0]. Each script runs on both sides
(`tests/scripts/unsorted_group.py`)."""

from __future__ import annotations

import pytest

from simdist.agent_race import agent_races, noted_agent_races
from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "scripts" / "unsorted_group.py"

pytestmark = pytest.mark.real


def _compare(zygote, args: list[str], nproc: int, status=None):
    run_id = new_run_id()
    both = compare_script(SCRIPT, args, nproc_per_node=nproc, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=zygote, timeout_s=60, hang_after_s=0.3, status=status)
    assert tagged_processes(run_id) == []
    return both.sim.report, both.real.report


@pytest.mark.parametrize(("args", "nproc"), [([], 2), ([], 3), (["pair"], 3), (["late"], 3)])
def test_a_groups_given_order_numbers_its_members_on_both_sides(script_zygote, args, nproc):
    sim, real = _compare(script_zygote, args, nproc)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    ranks = list(reversed(range(nproc))) if not args else [nproc - 1, 0]
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        for me, r in enumerate(ranks):
            assert rep.ranks[r].output == [
                f"rank {r}: group rank {me} of {ranks}; all_gather {[float(x) for x in ranks]}; "
                f"broadcast {float(ranks[0])}; scatter {10.0 + me}; "
                f"gather {[float(x) for x in ranks] if me == 0 else None}; "
                f"p2p {float(ranks[0]) if me < 2 else float(r)}"], rep.source


@pytest.mark.parametrize("nproc", [2, 3])
def test_a_group_timeout_names_the_missing_member_by_its_given_place(script_zygote, nproc):
    """Group [last, 0], rank 0 exits: the last rank waits for group rank 1's address."""
    sim, real = _compare(script_zygote, ["timeout", "0.5"], nproc)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    for rep in (sim, real):
        err = rep.ranks[nproc - 1].error
        assert err.type == "DistStoreError" and err.message.startswith("wait timeout after 500ms, keys: /") \
            and err.message.endswith("//cpu//0/1"), rep.source


def test_the_status_lines_name_the_group_in_its_given_order(script_zygote, monkeypatch):
    """Group [2, 0], rank 0 comes 1.5 s late (it computes): both sides' status lines name the group's
    members in group-rank order, as torch's `global_ranks_in_group` has them."""
    from simdist.script import initwatch

    monkeypatch.setattr(initwatch, "STATUS_AFTER_S", 0.3)
    lines: list[str] = []
    sim, real = _compare(script_zygote, ["late"], 3, status=lines.append)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    for side in ("simulated side", "real side"):
        said = [x for x in lines if x.startswith(f"new_group: {side}: waiting ")]
        assert said and "rank(s) [2] waiting in new_group at unsorted_group.py:" in said[0] \
            and "for the group of ranks [2, 0]; rank(s) [0] never came; " in said[0], lines


@pytest.mark.parametrize("mode", ["ops", "sizes"])
def test_mismatched_calls_pair_in_the_ring_of_group_ranks(script_zygote, mode):
    """Group [1, 0, 2]: group rank 0 all-reduces with MAX (`ops`) or 8 elements where the
    others have 6 (`sizes`). Gloo's ring runs over group ranks, so each segment's owner, the
    values each rank gets, and which rank meets the longer message and aborts, follow the
    given order. The pairing rules mapped global ranks to group ranks in ascending order
    (`gloo_rules._rank_maps`): the simulator named rank 0 as the one that aborts where real
    Gloo aborts rank 2, and mixed segments by the wrong owners' ops.
    `sizes`: ranks 0 and 1 lose rank 2 in the ring as it aborts; on real Gloo they raise only
    once their own threads see the closure, which under load torchrun's agent's poll after the
    abort can beat (simdist's real side SIGTERMed one or both in 5 of 30 runs beside two CPU
    hogs: docs/script-backend.md, "torchrun's agent"). The simulator keeps their loss and notes
    that race on them; a real run that went the other way differs by it alone."""
    sim, real = _compare(script_zygote, [mode], 3)
    c = compare_reports(sim, real)
    assert sorted(noted_agent_races(sim)) == ([0, 1] if mode == "sizes" else []), sim.notes
    assert c.agree or agent_races(sim, real, c), format_comparison(c)
    assert real.ranks[2].status == ("aborted" if mode == "sizes" else "completed"), real.source
    if mode == "ops":
        assert [r.status for r in real.ranks] == ["completed"] * 3, real.source
        assert len({tuple(r.output) for r in real.ranks}) > 1, real.source  # the ops mixed: not one sum


@pytest.mark.parametrize("nproc", [2, 3])
def test_ranks_passing_the_members_in_different_orders_wait_for_the_group_rank_nobody_took(script_zygote, nproc):
    """Each rank passes the world with itself first: each registers its address as group
    rank 0 and waits for group rank 1's, which nobody writes, so every rank raises the
    store's wait timeout on real torch. The simulator compared the orders, called it a
    protocol error and let every rank through: they completed."""
    sim, real = _compare(script_zygote, ["orders", "0.5"], nproc)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    for rep in (sim, real):
        assert [(r.status, r.error.type) for r in rep.ranks] == [("error", "DistStoreError")] * nproc, rep.source
        assert all(r.error.message.endswith("//cpu//0/1") for r in rep.ranks), rep.source
