"""Deadlines of different kinds fire in the order of simulated time (`deadlines.next_due`):
a Gloo timeout and new_group's store wait at once, each run on both sides
(`tests/scripts/deadline_order.py`). The coordinator ended every new_group wait before any
Gloo timeout, whichever came first: with the all_reduce's timeout (or monitored_barrier's)
at 1 s and the group's at 3 s the simulated ranks 1.. raised DistStoreError at 3 s where
real Gloo makes the group at 1 s; so with `Work.wait(timeout=1 s)`. The unit tests below
take the chooser itself through kinds side by side (a new_group wait against a store barrier's)."""

from __future__ import annotations

from types import SimpleNamespace

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from simdist.script.deadlines import CLOSURE_S, TIE_S, Deadline, frees_before, next_due, overdue
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "scripts" / "deadline_order.py"


def _compare(zygote, args: list[str], nproc: int):
    run_id = new_run_id()
    both = compare_script(SCRIPT, args, nproc_per_node=nproc, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=zygote, timeout_s=90, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    return both.sim.report, both.real.report


def _collective_lines(mode: str, nproc: int, gloo_first: bool) -> list[list[str]]:
    """`all_reduce` and `monitored` modes: rank 0's collective, the others' new_group first."""
    if gloo_first:  # rank 0's collective times out, then it makes the group with the others
        return [[f"0 {mode} raised RuntimeError", "0 new_group ok"]] + [[f"{r} new_group ok"] for r in range(1, nproc)]
    # the others' new_group raises; they join rank 0's collective; rank 0 is refused by their left addresses
    done = float(nproc) if mode == "all_reduce" else "ok"
    return [[f"0 {mode} {done}", "0 new_group raised RuntimeError"]] + \
        [[f"{r} new_group raised DistStoreError", f"{r} {mode} {done}"] for r in range(1, nproc)]


def _wait_lines(_mode: str, nproc: int, wait_first: bool) -> list[list[str]]:
    """`wait` mode: rank 0's `Work.wait(timeout=)` against the others' new_group."""
    total = float(nproc)
    if wait_first:  # only rank 0's wait ends; it makes the group, the others join its all_reduce
        return [["0 wait raised RuntimeError", "0 new_group ok", f"0 wait {total}"]] + \
            [[f"{r} new_group ok", f"{r} all_reduce {total}"] for r in range(1, nproc)]
    return [[f"0 wait {total}", "0 new_group raised RuntimeError"]] + \
        [[f"{r} new_group raised DistStoreError", f"{r} all_reduce {total}"] for r in range(1, nproc)]


def _relay_lines(_mode: str, nproc: int, gloo_first: bool) -> list[list[str]]:
    if gloo_first:  # the receives time out; ranks 2.. then make the group with rank 1
        return [["0 recv raised RuntimeError"], ["1 new_group ok"]] + \
            [[f"{r} recv raised RuntimeError", f"{r} new_group ok"] for r in range(2, nproc)]
    # rank 1's new_group raises and it sends to everyone; ranks 2.. are refused by its left address
    return [["0 recv 7.0"], ["1 new_group raised DistStoreError"]] + \
        [[f"{r} recv 7.0", f"{r} new_group raised RuntimeError"] for r in range(2, nproc)]


@pytest.mark.real
@pytest.mark.parametrize(("mode", "nproc", "gloo_s", "group_s"), [
    ("all_reduce", 2, 1, 3), ("all_reduce", 2, 3, 1), ("all_reduce", 3, 1, 3),
    ("monitored", 3, 1, 3), ("monitored", 3, 3, 1), ("wait", 3, 1, 3), ("wait", 3, 3, 1),
    # (relay 1 4: rank 2 makes the group after its receive timed out, 3 s inside rank 1's wait:
    # 1 3 left 2 s, which a rank at CI load once missed on the real side)
    ("relay", 3, 1, 4), ("relay", 3, 3, 1),
])
def test_the_deadline_due_first_fires_first_whatever_its_kind(script_zygote, mode, nproc, gloo_s, group_s):
    sim, real = _compare(script_zygote, [mode, str(gloo_s), str(group_s)], nproc)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    lines = {"relay": _relay_lines, "wait": _wait_lines}.get(mode, _collective_lines)(mode, nproc, gloo_s < group_s)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        assert [r.output for r in rep.ranks] == lines, rep.source
    # the first deadline's time is when the freed ranks went on, on the simulated clocks
    assert max(r.time for r in sim.ranks) == pytest.approx(min(gloo_s, group_s), abs=0.05)


def _d(at: float, rank: int, kind: str, fired: list) -> Deadline:
    return Deadline(at, rank, kind, None, (kind, rank), fired.append)


def test_the_chooser_takes_the_earliest_of_any_kind_and_only_its_kinds_ties():
    fired: list = []
    pending = [_d(3.0, 0, "gloo", fired), _d(1.0, 1, "new_group", fired), _d(1.2, 2, "new_group", fired),
               _d(1.1, 3, "store_barrier", fired), _d(1.0 + TIE_S + 0.1, 4, "new_group", fired)]
    assert [(d.kind, d.rank) for d in next_due(pending)] == [("new_group", 1), ("new_group", 2)]
    # the store barrier's 1.1 s, within TIE_S of 1.0 s, is of another kind: it waits its turn
    pending = [d for d in pending if d.kind != "new_group"]
    assert [(d.kind, d.rank) for d in next_due(pending)] == [("store_barrier", 3)]
    assert next_due([]) == []


def test_a_work_wait_due_first_fires_alone():
    fired: list = []
    pending = [_d(2.0, 0, "gloo", fired), _d(1.9, 1, "wait", fired)]
    assert [d.kind for d in next_due(pending)] == ["wait"]


def test_a_blocked_rank_freed_before_a_deadline_may_still_post():
    """Rank 0's op waits until 3 s on rank 2, which is past it; rank 1 is blocked in
    new_group until 1 s: it may raise then and post (or exit) before 3 s, so rank 0's
    deadline is not yet certain to be what ends its wait. Blocked without an earlier deadline
    of its own (or one of the same kind within the tie), it cannot."""
    def rank(r: int, clock: float, blocked: bool):
        return SimpleNamespace(rank=r, clock=clock, blocked=lambda: blocked, exit=None)

    owner, freed, late = rank(0, 0.0, True), rank(1, 0.0, True), rank(2, 5.0, False)
    live = [owner, freed, late]
    fired: list = []
    group = [_d(1.0, 1, "new_group", fired)]

    def awaits(_call, r):
        return r == 2

    assert frees_before(group, 3.0, "gloo") and not frees_before(group, 1.0, "gloo")
    assert not frees_before([_d(3.0 - TIE_S / 2, 1, "gloo", fired)], 3.0, "gloo")
    assert overdue(awaits, None, 3.0, owner, live)  # rank 1 counted as stuck: as before
    assert not overdue(awaits, None, 3.0, owner, live, freed=lambda c: c is freed)
    assert overdue(awaits, None, 3.0, owner, live, posting=late, freed=lambda c: c is freed)  # the late rank posts now


TIE_SCRIPT = ROOT / "tests" / "scripts" / "tie_groups.py"


@pytest.mark.real
@pytest.mark.parametrize(("world_s", "pair_s"), [(1, 1 + TIE_S * 0.6), (1 + TIE_S * 0.6, 1)])
def test_a_deadline_in_another_group_does_not_tie(script_zygote, world_s, pair_s):
    """Two Gloo deadlines within `TIE_S`, in different groups (`tests/scripts/tie_groups.py`):
    the first frees its rank, which sends on the other group before the second's deadline.
    Tied (before), rank 1's receive timed out with it and rank 0's send met its closure;
    real Gloo's receive gets the message (a timeout closes pairs in its own group only)."""
    run_id = new_run_id()
    both = compare_script(TIE_SCRIPT, [str(world_s), str(pair_s)], nproc_per_node=2, backend="gloo", run_id=run_id,
                          measure_compute=False, zygotes=script_zygote, timeout_s=90, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    if world_s < pair_s:
        lines = [["0 all_reduce raised RuntimeError", "0 sent"], ["1 recv 7.0"]]
    else:
        lines = [["0 all_reduce raised RuntimeError", "0 send raised RuntimeError "], ["1 recv raised RuntimeError timed out"]]
    for rep in (both.sim.report, both.real.report):
        assert [r.output for r in rep.ranks] == lines, rep.source


def test_deadlines_tie_only_in_their_own_scope():
    """`Deadline.scope` (a Gloo op's group, a new_group's or store barrier's wait): one of the
    same kind in another scope within `TIE_S` fires only at its turn, and a blocked rank with
    one such deadline before `at` counts as one that may still post."""
    fired: list = []
    first = Deadline(1.0, 0, "gloo", None, 0, fired.append, "world")
    same = Deadline(1.0 + TIE_S / 2, 1, "gloo", None, 1, fired.append, "world")
    other = Deadline(1.0 + TIE_S / 2, 2, "gloo", None, 2, fired.append, "pair")
    assert next_due([first, same, other]) == [first, same]
    assert next_due([other, same]) == [same] and next_due([other]) == [other]
    assert frees_before([first], 1.0 + TIE_S / 2, "gloo", "pair")
    assert not frees_before([first], 1.0 + TIE_S / 2, "gloo", "world")


@pytest.mark.real
@pytest.mark.parametrize("gap_s", [0.05, TIE_S * 0.6])
def test_a_receive_from_a_rank_that_timed_out_earlier_meets_its_closure(script_zygote, gap_s):
    """Within one group and `TIE_S`, rank 1's receive from rank 0 is due `gap_s` after rank 0's
    all_reduce (`tests/scripts/closure_first.py`): rank 0's timeout closes its pair with rank 1
    first, on real Gloo within a few ms (`CLOSURE_S`). Tied (before), the receive timed out on
    its own at its deadline."""
    run_id = new_run_id()
    both = compare_script(ROOT / "tests" / "scripts" / "closure_first.py", ["1", str(gap_s)], nproc_per_node=2,
                          backend="gloo", run_id=run_id, measure_compute=False, zygotes=script_zygote, timeout_s=90,
                          hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    for rep in (both.sim.report, both.real.report):
        assert [r.output for r in rep.ranks] == [["0 raised timed out"], ["1 raised closed"]], rep.source


def test_a_p2p_deadline_tied_only_within_the_closures_latency():
    """`Deadline.peers`: a receive from the batch's first rank ties with it only within
    `CLOSURE_S` (both block at once: each times out on its own); later, it is left to the
    closure. One from another rank, or a collective's (no peers), ties as before."""
    fired: list = []
    first = Deadline(1.0, 0, "gloo", None, 0, fired.append, "g")
    at_once = Deadline(1.0 + CLOSURE_S / 2, 1, "gloo", None, 1, fired.append, "g", frozenset({0}))
    later = Deadline(1.0 + CLOSURE_S * 5, 1, "gloo", None, 1, fired.append, "g", frozenset({0}))
    elsewhere = Deadline(1.0 + CLOSURE_S * 5, 2, "gloo", None, 2, fired.append, "g", frozenset({3}))
    collective = Deadline(1.0 + CLOSURE_S * 5, 3, "gloo", None, 3, fired.append, "g")
    assert next_due([first, at_once]) == [first, at_once]
    assert next_due([first, later, elsewhere, collective]) == [first, elsewhere, collective]
