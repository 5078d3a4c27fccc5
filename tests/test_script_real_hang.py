"""Real Gloo's hang verdict before the watchdog (`simdist.script.stalls`, `rank.stall`).

A script that hangs on real Gloo used to run until the watchdog (`--timeout`, 300 s): now the
run is called hung once every live rank has been stalled in a torch.distributed wait for the
settle period, and `compare` agrees with the simulator (which proves its hangs at once) on
each rank's operations, blocked operation and line. A rank that sleeps or computes longer
than the settle period before it joins is not a hang: the run completes on both sides."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script import env
from simdist.script.api import compare_script, run_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT, descendants, line_of

pytestmark = pytest.mark.real

SCRIPTS = ROOT / "tests" / "scripts"


def _compare(script_zygote, name: str, args: list[str], hang_after_s: float, nproc: int = 2,
             watchdog_s: float = 300):
    """Both sides, with a 300 s watchdog (the default) unless told, forked by the session's fork servers;
    no process of either run survives it."""
    run_id = new_run_id()
    both = compare_script(SCRIPTS / name, args, nproc_per_node=nproc, backend="gloo", timeout_s=watchdog_s,
                          hang_after_s=hang_after_s, run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    return both.sim.report, both.real.report


@pytest.mark.parametrize(("name", "blocked"), [
    # blocking collective and recv, each on its own line
    ("recv_nobody_sends.py", [("all_reduce", "dist.all_reduce(t)"), ("recv", "dist.recv(")]),
    # DDP's reducer waiting in C++ inside loss.backward(), and a barrier on another group
    ("ddp_step_vs_side_barrier.py", [("all_reduce", ".backward()"), ("barrier", "dist.barrier(group=side)")]),
    # a DataLoader's worker processes alive: the main process has its queues' feeder threads
    ("hang_with_dataloader_workers.py", [("recv", "dist.recv("), ("barrier", "dist.barrier()")]),
    # ... and, with pin_memory=True on the simulated GPUs, its pin-memory thread, which waits
    # for batches with a timeout (it was taken for a thread that could post: the watchdog)
    ("hang_with_dataloader_workers.py --pin-memory", [("recv", "dist.recv("), ("barrier", "dist.barrier()")]),
])
def test_a_real_hang_is_found_in_seconds_and_compare_agrees(script_zygote, name, blocked):
    name, *args = name.split()
    sim, real = _compare(script_zygote, name, args, hang_after_s=1.0)
    assert real.timings["wall_s"] < 60, real.timings  # the watchdog alone: more than 300 s
    assert 1.0 <= real.timings["hang_detect_s"] < 30, real.timings
    assert any(n.startswith("hang found early (--hang-after 1 s, not the 300 s watchdog): ") for n in real.notes)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["hang", "hang"], rep.source
        assert [(r.blocked_in.op, r.location.line) for r in rep.ranks] == [
            (op, line_of(SCRIPTS / name, text)) for op, text in blocked], rep.source
    c = compare_reports(sim, real)
    assert c.agree and not any(rc.unrecorded for rc in c.ranks), format_comparison(c)


@pytest.mark.parametrize("how", ["reverse", "collect"])
def test_an_async_mismatch_hang_is_found_in_seconds(script_zygote, how):
    """Rank 1 of 4 issues its two async all_reduces in the other order, of other sizes; every
    rank then waits its works (in reverse order, or through `torch.futures.collect_all`). Gloo
    completed a rank's later op while its earlier one never did, so the Flight Recorder's
    counters read level (2 enqueued, 2 completed) on a rank blocked in `wait`: the real side
    ran until the watchdog. Now a rank in a wait reads its unfinished entries (`rank.stall`)."""
    sim, real = _compare(script_zygote, "async_mismatch_hang.py", [how], hang_after_s=1.0, nproc=4)
    assert real.timings["wall_s"] < 60, real.timings
    assert 1.0 <= real.timings["hang_detect_s"] < 30, real.timings
    assert any(n.startswith("hang found early (--hang-after 1 s, not the 300 s watchdog): ") for n in real.notes)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["hang"] * 4, rep.source
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


def test_a_finished_groups_short_timeout_does_not_hold_back_an_async_mismatch_hang(script_zygote):
    """As above, after an all_reduce on a group with a 30 s timeout, which completed. Gloo's
    Flight Recorder entries never read completed, only retired: read as unfinished, that group
    counted as pending, its 30 s (under the 60 s watchdog) said torch might end the wait first,
    and the real side ran to the watchdog. Only unretired entries count (`rank.stall._groups`)."""
    sim, real = _compare(script_zygote, "async_mismatch_hang.py", ["reverse", "30"], hang_after_s=1.0, nproc=4,
                         watchdog_s=60)
    assert 1.0 <= real.timings["hang_detect_s"] < 25, real.timings
    assert any(n.startswith("hang found early (--hang-after 1 s, not the 60 s watchdog): ") for n in real.notes)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["hang"] * 4, rep.source
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


@pytest.mark.parametrize("how", ["sleep", "compute"])
def test_a_peer_busy_longer_than_the_settle_period_is_not_a_hang(script_zygote, how):
    """Rank 0 waits in an all_reduce (stalled, by its own account) for 1.5 s while rank 1
    sleeps or computes, five times the settle period: the run completes on both sides."""
    sim, real = _compare(script_zygote, "peer_busy_then_joins.py", [how, "1.5"], hang_after_s=0.3)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed", "completed"], (rep.source, rep.notes)
        assert [r.output for r in rep.ranks] == [["0 done [4.0, 4.0]"], ["1 done [4.0, 4.0]"]], rep.source
    assert real.timings["wall_s"] >= 1.5 and not any("hang found early" in n for n in real.notes)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


@pytest.mark.parametrize("how", ["sleep", "timer"])
def test_a_thread_that_posts_after_sleeping_keeps_the_rank_from_being_stalled(script_zygote, how):
    """Both main threads wait in a recv (stalled, by the main threads' account) while a
    thread of rank 1 (its own, or a `threading.Timer`, all standard library) sleeps 1.5 s,
    five times the settle period, before it sends what rank 0 waits for: a thread that
    sleeps uses no CPU yet may post an operation, so the run is no hang and completes, on
    real Gloo (the stall rule) and in the simulator (the rank's claim, `rank.threads`), each
    rank's recv lasting the thread's sleep by its clock (the simulator ends that timed wait in
    simulated time once both main threads wait, `rank.timedwait`: its wall time is no measure)."""
    sim, real = _compare(script_zygote, "thread_sends_later.py", [how, "1.5"], hang_after_s=0.3)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed", "completed"], (rep.source, rep.notes)
        assert [r.output for r in rep.ranks] == [[f"{r} done [{r + 1}.0, {r + 1}.0] after the thread's sleep: True"]
                                                 for r in (0, 1)], rep.source
        assert not any("hang" in n for n in rep.notes), (rep.source, rep.notes)
    assert real.timings["wall_s"] >= 1.5, real.timings
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


def test_a_hang_is_found_once_the_thread_that_could_post_ends(script_zygote):
    """As above, but rank 1's thread ends after 1 s without sending: from then on no thread
    can post, and both sides call the run hung (the simulator as soon as the rank says its
    thread ended, which its sleep, a timed wait, does at once in simulated time; real Gloo after
    the settle period), with both main threads in their recv."""
    sim, real = _compare(script_zygote, "thread_sends_later.py", ["quits", "1.0"], hang_after_s=0.3)
    script = SCRIPTS / "thread_sends_later.py"
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["hang", "hang"], (rep.source, rep.notes)
        assert [(r.blocked_in.op, r.location.line) for r in rep.ranks] == [
            ("recv", line_of(script, "dist.recv(t, src=1)")), ("recv", line_of(script, "dist.recv(t, src=0)"))]
        assert rep.timings["wall_s"] < 60, rep.timings  # not the watchdog
    assert real.timings["wall_s"] >= 1.0, real.timings  # not before the thread ended
    assert sim.timings["hang_detect_s"] < 1.0, sim.timings  # from the thread's end: the rank's next claim
    c = compare_reports(sim, real)
    assert c.agree and not any(rc.unrecorded for rc in c.ranks), format_comparison(c)


def test_a_side_threads_wait_with_a_timeout_bounds_the_stall(script_zygote):
    """Both main threads wait in a recv while a thread of rank 1 waits on a side group with
    `work.wait(timeout=1.5 s)`: Gloo ends that wait with an error, and the thread then sends
    what rank 0 waits for. A timeout shorter than the watchdog on any thread's wait leaves
    the run to go on; the simulator agrees. Its run once differed from run to run: rank 0's
    WORLD send met the side group's pending irecv (p2p paired across groups), or the main
    thread's claim proved a hang before the thread's timed wait reached the coordinator."""
    sim, real = _compare(script_zygote, "thread_wait_times_out.py", ["1.5"], hang_after_s=0.3)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed", "completed"], (rep.source, rep.notes)
        assert [r.output for r in rep.ranks] == [["0 done [1.0, 1.0]"],
                                                 ["1 side wait ended: timed out", "1 done [2.0, 2.0]"]]
        assert rep.findings == [] and not any("hang found early" in n for n in rep.notes)
        # rank 1's main thread and its helper issue at once: how their operations interleave is
        # the threads' race on either side; each group's own order is the program's
        rep.ranks[1].trace.sort(key=lambda e: (e.group, e.seq))
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


def _real(script_zygote, name: str, args: list[str], nproc: int, hang_after_s: float):
    """The real side alone (the simulator's rendezvous has its own tests), 300 s watchdog."""
    run_id = new_run_id()
    rep = run_script(SCRIPTS / name, args, nproc_per_node=nproc, backend="gloo", timeout_s=300, mode=env.GLOO,
                     hang_after_s=hang_after_s, run_id=run_id, measure_compute=False, zygote=script_zygote(env.GLOO))
    assert tagged_processes(run_id) == []
    return rep


def _store_note(rep, waits: dict[int, str], script: str) -> None:
    """The early verdict's note names each rank's wait at the store: its call and line."""
    early = [n for n in rep.notes if n.startswith("hang found early (--hang-after 0.5 s, not the 300 s watchdog): ")]
    named = "; ".join(f"rank {r} in {what} at {script}:{line_of(SCRIPTS / script, text)}"
                      for r, (what, text) in sorted(waits.items()))
    assert len(early) == 1 and f"waiting for peers that never come: {named}; " in early[0], rep.notes
    # each such rank's own note says what it waits in, in the simulated side's words (not "still running")
    for r, (what, text) in waits.items():
        said = f"rank {r} is waiting in {what} at {script}:{line_of(SCRIPTS / script, text)} "
        assert any(n.startswith(said) for n in rep.notes), rep.notes


@pytest.mark.parametrize(("name", "args", "nproc", "waits", "statuses"), [
    # init_process_group waits for a torchrun-style rank whose process exits before its init
    ("init_waits_for_world.py", ["exits"], 3,
     {0: ("init_process_group", "dist.init_process_group("), 1: ("init_process_group", "dist.init_process_group(")},
     ["hang", "hang", "error"]),
    # new_group waits for a member that never calls it: it waits in a barrier of the world ...
    ("new_group_member_skips.py", ["barrier"], 2, {0: ("new_group", "dist.new_group(")}, ["hang", "hang"]),
    # ... or has exited (a peer that failed its init: pg_timeouts.py --case monitored_sub's race)
    ("new_group_member_skips.py", ["exits"], 2, {0: ("new_group", "dist.new_group(")}, ["hang", "completed"]),
])
def test_a_wait_at_the_store_for_a_rank_that_never_comes_is_found_in_seconds(script_zygote, name, args, nproc,
                                                                             waits, statuses):
    """A rank waiting at the c10d store (init's rendezvous, a group's full-mesh connect) for a
    peer that never comes waits, on real torch, until the wait's timeout: torch's default of
    30 min here, past the watchdog. Before the store waits counted as stalls, such a run lasted
    the whole watchdog (300 s; a world missing a rank at init: the 120 s start-up allowance too)."""
    rep = _real(script_zygote, name, args, nproc, hang_after_s=0.5)
    assert [r.status for r in rep.ranks] == statuses, rep.notes
    assert 0.5 <= rep.timings["hang_detect_s"] < 30 and rep.timings["wall_s"] < 60, rep.timings
    _store_note(rep, waits, name)


@pytest.mark.parametrize(("name", "args", "nproc", "out"), [
    ("init_waits_for_world.py", ["sleeps2"], 3, [["0 done 3.0"], ["1 done 3.0"], ["2 done 3.0"]]),
    ("new_group_member_skips.py", ["sleeps2"], 2, [["0 done 2.0"], ["1 done 2.0"]]),
])
def test_a_late_rank_at_the_store_is_waited_for(script_zygote, name, args, nproc, out):
    """The last rank sleeps 2 s (four settle periods) before its init or its new_group while
    its peers wait at the store: a rank still to come is not stalled, so no verdict; all go on."""
    rep = _real(script_zygote, name, args, nproc, hang_after_s=0.5)
    assert [r.output for r in rep.ranks] == out and not any("hang" in n for n in rep.notes), rep.notes
    assert rep.timings["wall_s"] >= 2.0


def test_a_store_wait_with_a_timeout_runs_its_course(script_zygote):
    """`init_process_group(timeout=2 s)`, shorter than the watchdog, ends the store wait with
    torch's error: the run is left to run into it, as a collective's Gloo timeout is."""
    rep = _real(script_zygote, "init_waits_for_world.py", ["exits", "2"], 3, hang_after_s=0.5)
    assert [r.status for r in rep.ranks] == ["error"] * 3 and not any("hang" in n for n in rep.notes), rep.notes
    assert [r.error.message for r in rep.ranks[:2]] == ["wait timeout after 2000ms, keys: /default_pg/0//cpu//0/2"] * 2
