"""The Join tutorial's DDP loop without Join: rank 1's sixth backward has no partner.

Asked for nccl (as the tutorial does), the exited rank 0 leaves rank 1 blocked: reported as a
hang at once, naming rank 1's blocked gradient all-reduce, the line of its `loss.backward()`,
and where rank 0 left. With gloo semantics the same program fails instead ("Connection closed
by peer"), as scenarios/no_join_exit.toml does on real Gloo."""

from __future__ import annotations

import copy
import subprocess

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script import run_script
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import EXAMPLES, ROOT, descendants, line_of

pytestmark = pytest.mark.real

NO_JOIN = EXAMPLES / "join_tutorial_no_join.py"


@pytest.fixture
def no_join(example_run):
    """The session's run of the no-Join program as the tutorial has it (nccl; `example_run`:
    the program as-is, every process ended with the report), shared by the tests below."""
    return example_run(NO_JOIN.name)


def test_no_join_hang_is_reported_at_once_with_the_users_lines(no_join):
    rep = no_join
    assert rep.outcome == "hang" and rep.backend == "nccl"
    r0, r1 = rep.ranks
    assert r1.status == "hang"
    for e in (r1.blocked_in, r1.waiting_in):
        assert (e.op, e.numel, e.origin, e.group, e.seq) == ("all_reduce", 2, "ddp.backward.bucket_allreduce", "WORLD", 11)
        assert not e.completed
    assert (r1.location.line, r1.location.function, r1.location.code) == \
        (line_of(NO_JOIN, "loss.backward()"), "worker", "loss.backward()")
    assert r0.status == "completed" and r0.exit == "returned normally"
    assert r0.output == ["Rank 0 has exhausted all 5 of its inputs!"] and r1.output == []
    assert r0.location.line == line_of(NO_JOIN, "has exhausted all")
    assert len(r0.trace) == 10 and all(e.completed for e in r0.trace)
    hang = [f for f in rep.findings if f.kind == "hang"]
    assert len(hang) == 1 and hang[0].ranks == [0] and hang[0].seq == 11
    notes = "\n".join(rep.notes)
    assert "rank 1 is blocked in #11 all_reduce[2]" in notes and "loss.backward()" in notes
    assert "rank 0 left: returned normally" in notes
    # why, as a scenario's explanation says it: read from the traces
    assert "hint (a rank finished while others wait): rank(s) [0] got through everything they issued while rank 1 " \
           "is in DDP reducer: gradient bucket all-reduce at #11; without Join" in notes, notes
    # within 2 s of the last rank blocking (rank 1's wait, or rank 0's exit, whichever came last)
    assert rep.timings["hang_detect_s"] < 2.0 and rep.timings["hang_report_s"] < 2.0


def test_no_join_with_gloo_semantics_fails_on_the_exited_peer(example_run):
    rep = example_run(NO_JOIN.name, backend="gloo")  # the simulated side of test_script_real's comparison
    assert rep.outcome == "error"
    r0, r1 = rep.ranks
    assert r0.status == "completed"
    assert r1.status == "error" and r1.error.category == "peer_lost"
    assert "Connection closed by peer (rank 0 has exited)" in r1.error.message
    assert r1.location.code == "loss.backward()"  # the backward that waited on the failed all-reduce
    assert r1.trace[-1].origin == "ddp.backward.bucket_allreduce" and not r1.trace[-1].completed
    assert any(f.kind == "peer_exited" for f in rep.findings)


def _without_times(d: dict) -> dict:
    """A report's dict without anything measured (wall times, compute, the times that follow)."""
    d.pop("timings", None)
    for r in d["ranks"]:
        r["time"] = None
        r.pop("compute", None)  # measured compute spans
        for e in r["trace"] + [r["blocked_in"], r["waiting_in"]]:
            if e is not None:
                e["t_issue"] = e["t_done"] = None
    return d


@pytest.mark.parametrize("name", ["join_tutorial_no_join.py", "join_tutorial_counter.py"])
def test_two_runs_give_the_same_report(name, example_run, script_zygote):
    """Two runs with --zero-compute, one forked by the zygote and one launched (its own
    interpreters and hash seeds, so nondeterminism can show): the same report, times
    included. A run that measures compute differs from them in its times only (trace,
    outcome, values, lines: the same)."""
    measured = example_run(name)
    c, d = (_run_example(name, script_zygote, measure_compute=False, forked=f).to_dict() for f in (True, False))
    c.pop("timings")
    d.pop("timings")
    assert c == d
    assert _without_times(measured.to_dict()) == _without_times(c)


def _run_example(name: str, zygote, forked: bool = True, **kw):
    """A run of its own (the session's is `example_run`'s), its ranks forked by the session's
    zygote or (`forked=False`) launched; none of its processes left after it."""
    run_id, z = new_run_id(), zygote("sim")
    where = {"zygote": z} if forked else {"stdout": subprocess.DEVNULL}
    report = run_script(EXAMPLES / name, timeout_s=180, run_id=run_id, **where, **kw)
    assert tagged_processes(run_id) == [] and descendants(z.pid) == []
    return report


RECV_NOBODY_SENDS = ROOT / "tests" / "scripts" / "recv_nobody_sends.py"


def test_a_real_hang_keeps_each_ranks_record_and_compare_compares_it(script_zygote):
    """On real Gloo a hang the stall rule is not asked to find (`hang_after_s=None`; it is, by
    default: tests/test_script_real_hang.py) is ended by the watchdog; before killing the ranks the launcher asks
    each for its record (Flight Recorder, p2p operations, the line its main thread is blocked
    at), so `simdist compare` compares operations, blocked operation and line, not only
    status and output; sides that hang at different places DIFFER."""
    run_id = new_run_id()
    both = compare_script(RECV_NOBODY_SENDS, nproc_per_node=2, backend="gloo", timeout_s=3, run_id=run_id,
                          measure_compute=False, zygotes=script_zygote, hang_after_s=None)  # the watchdog's path
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    sim, real = both.sim.report, both.real.report
    at_reduce, at_recv = line_of(RECV_NOBODY_SENDS, "dist.all_reduce(t)"), line_of(RECV_NOBODY_SENDS, "dist.recv(")
    for rep in (sim, real):
        r0, r1 = rep.ranks
        assert [r.status for r in rep.ranks] == ["hang", "hang"], rep.source
        assert [e.op for e in r0.trace] == ["all_reduce"] * 3 and [e.op for e in r1.trace] == ["all_reduce"] * 2 + ["recv"]
        assert (r0.blocked_in.op, r0.blocked_in.seq, r1.blocked_in.op, r1.blocked_in.peer) == ("all_reduce", 3, "recv", 0)
        assert (r0.location.line, r1.location.line) == (at_reduce, at_recv), rep.source
    notes = "\n".join(real.notes)
    assert "rank 1 is blocked (its oldest unfinished operation: #1 recv" in notes and "blocked in an unfinished" in notes
    c = compare_reports(sim, real)
    assert c.agree and not any(rc.unrecorded for rc in c.ranks), format_comparison(c)
    assert "rank 1: agree (3 sim / 3 real collectives)" in format_comparison(c)
    # a simulator that hung rank 1 in a third all_reduce instead of the recv: reported, not agreed
    other = copy.deepcopy(sim)
    r1 = other.ranks[1]
    r1.trace[-1] = r1.blocked_in = copy.deepcopy(other.ranks[0].trace[-1])
    r1.location = copy.deepcopy(other.ranks[0].location)
    c = compare_reports(other, real)
    assert not c.agree and {d.field for d in c.differences if d.rank == 1} == {"trace", "location", "blocked_in"}
    assert "DIFFER" in format_comparison(c).splitlines()[0]
    assert f"ended at: sim recv_nobody_sends.py:{at_reduce} | real recv_nobody_sends.py:{at_recv}" \
        in format_comparison(c)


WAIT_OUTSIDE_OPS = ROOT / "tests" / "scripts" / "wait_outside_ops.py"


def test_a_rank_waiting_outside_any_operation_ends_where_it_waits_on_both_sides(script_zygote):
    """tests/scripts/wait_outside_ops.py: rank 1 waits on a queue nobody fills, rank 0 in an
    all_reduce: the watchdog ends the run; each side's rank 1 ended at the queue's get (where
    its main thread stands, asked before the kill as on real Gloo), not at its last operation
    (the barrier), which the simulated side said before."""
    run_id = new_run_id()
    both = compare_script(WAIT_OUTSIDE_OPS, nproc_per_node=2, backend="gloo", timeout_s=2, run_id=run_id,
                          measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    sim, real = both.sim.report, both.real.report
    at_get, at_reduce = line_of(WAIT_OUTSIDE_OPS, "batches.get()"), line_of(WAIT_OUTSIDE_OPS, "dist.all_reduce(t)")
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["hang", "hang"], rep.source
        assert [r.location.line for r in rep.ranks] == [at_reduce, at_get], rep.source
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


LOCAL_SYNC_GROUPS = ROOT / "tests" / "scripts" / "local_sync_groups.py"


@pytest.mark.parametrize("pairs", ["disjoint", "chain"])
def test_group_creation_waits_for_the_members_of_its_name_as_gloo_does(pairs, script_zygote):
    """tests/scripts/local_sync_groups.py: pairs made with use_local_synchronization=True.
    Disjoint pairs complete; in a chain, ranks 1 and 2 name their pair differently (torch
    hashes how many groups the rank has) and Gloo's constructor waits for good: both hang in
    new_group, rank 0 in its all_reduce with rank 1. The simulator let every rank past
    new_group (and hung ranks 1 and 2 in all_reduces of two different groups)."""
    run_id = new_run_id()
    both = compare_script(LOCAL_SYNC_GROUPS, ["--pairs", pairs], nproc_per_node=3, backend="gloo", timeout_s=2,
                          run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    sim, real = both.sim.report, both.real.report
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    if pairs == "disjoint":
        assert [r.status for r in sim.ranks] == ["completed"] * 3
        assert "rank 1: pair (0, 1) sum 3.0" in sim.ranks[1].output
    else:
        made, reduce = line_of(LOCAL_SYNC_GROUPS, "dist.new_group("), line_of(LOCAL_SYNC_GROUPS, "dist.all_reduce(")
        assert [r.status for r in sim.ranks] == ["hang"] * 3
        assert [r.location.line for r in sim.ranks] == [reduce, made, made]
