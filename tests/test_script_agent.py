"""torchrun's agent: once a worker fails, the others end by SIGTERM (`simdist.script.agent`).

Checked against the real thing: the same script under `python -m torch.distributed.run`
(torch's torchrun) and on simdist's real side (`run_script(mode="gloo")`, torchrun-style),
per rank: the exit code torchrun's ChildFailedError names, and what each rank raised.
"""

from __future__ import annotations

import re
import subprocess
import sys

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.races import named_races
from simdist.script import run_script
from simdist.script.agent import terminated_words
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT, line_of

pytestmark = pytest.mark.real

SCRIPT = ROOT / "tests" / "scripts" / "agent_sigterm.py"
SLEEP = line_of(SCRIPT, "time.sleep(")


def torchrun(script, nproc: int, cwd, args: tuple[str, ...] = ()) -> dict[int, tuple[int, str | None]]:
    """Per rank under real torchrun: (exit code, the exception type it printed or None)."""
    out = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", str(nproc),
                          "--standalone", str(script), *args], cwd=cwd, capture_output=True, text=True,
                         timeout=120).stderr
    codes = {int(r): int(c) for r, c in re.findall(r"rank\s*: (\d+) \(local_rank.*?\n\s*exitcode\s*: (-?\d+)", out)}
    raised = dict(re.findall(r"^\[rank(\d+)\]: (\w+(?:Error|Exception)):", out, flags=re.M))
    return {r: (codes.get(r, 0), raised.get(str(r))) for r in range(nproc)}


def simdist_real(script, nproc: int) -> dict[int, tuple[int, str | None]]:
    """The same view of simdist's real side: -15 for a rank it says torchrun's agent ended."""
    run_id = new_run_id()
    report = run_script(script, nproc_per_node=nproc, mode="gloo", run_id=run_id, timeout_s=120,
                        stdout=subprocess.DEVNULL)
    assert tagged_processes(run_id) == []
    out = {}
    for r in report.ranks:
        term = r.exit is not None and "terminated by torchrun's agent" in r.exit
        own = r.error.type if r.error is not None and r.error.type != "SIGTERM" else None
        out[r.rank] = (-15 if term else 1 if r.status == "error" else 0, own)
    return out


def test_a_sleeping_peer_is_ended_by_sigterm_as_under_torchrun(tmp_path):
    real = torchrun(SCRIPT, 2, tmp_path)
    # rank 1's own teardown may abort (SIGABRT, -6: 7 of 82 runs, docs "torchrun's agent"), which
    # simdist's ranks skip (`rank.exits.leave`): its exception is the same, its status 1
    assert real[1] in ((1, "RuntimeError"), (-6, "RuntimeError")), real
    real[1] = (1, "RuntimeError")
    assert real == {0: (-15, None), 1: (1, "RuntimeError")}, real  # torchrun itself, as documented
    assert simdist_real(SCRIPT, 2) == real


def test_the_report_says_who_ended_the_rank_and_where(tmp_path):
    report = run_script(SCRIPT, nproc_per_node=2, mode="gloo", timeout_s=120, stdout=subprocess.DEVNULL)
    r0 = report.ranks[0]
    assert r0.exit == terminated_words(1) and r0.error is not None and r0.error.category == "killed"
    assert r0.location is not None and r0.location.line == SLEEP  # it never reached the all-reduce after it
    assert [e.op for e in r0.trace] == ["all_reduce"] and r0.output == []
    assert report.timings["agent_record_wait_s"] < 10


@pytest.mark.parametrize("args", [[], ["0"]], ids=["asleep", "in_the_collective"])
def test_the_simulated_side_agrees(tmp_path, monkeypatch, args):
    """Asleep: both sides end rank 0 by SIGTERM in its sleep. In the collective with the
    failed rank (no sleep): rank 0 fails there by itself first on both (torchrun: 20 of 20)."""
    monkeypatch.chdir(tmp_path)
    both = compare_script(SCRIPT, args, nproc_per_node=2, timeout_s=120, stdout=subprocess.DEVNULL)
    cmp = compare_reports(both.sim.report, both.real.report)
    assert cmp.agree, format_comparison(cmp)
    r0 = both.sim.report.ranks[0]
    if args:
        assert r0.error is not None and r0.error.category == "peer_lost"
    else:
        assert r0.exit == terminated_words(1) and r0.location is not None and r0.location.line == SLEEP
        assert len(r0.trace) == 1 and r0.output == []


def test_a_rank_whose_next_step_is_inside_the_band_is_a_named_agent_race(tmp_path, monkeypatch):
    """Rank 0 sleeps 0.5 s, well inside the band of real torchrun's SIGTERM after rank 1's
    failure (`agent.AGENT_EARLIEST_S`-`AGENT_LATEST_S`): the simulator's agent (at
    `agent_instant`) ends it in the sleep and its report names the race; real torchrun went
    either way (rank 0 lost rank 1 in the next all-reduce in 3 of 3 runs at load ~5, where rank
    1's teardown took over a second). A real run that got further is that race, named."""
    monkeypatch.chdir(tmp_path)
    both = compare_script(SCRIPT, ["0.5"], nproc_per_node=2, timeout_s=120, stdout=subprocess.DEVNULL)
    sim, real = both.sim.report, both.real.report
    assert sim.ranks[0].exit == terminated_words(1)
    assert [n.split(" (")[0] for n in sim.notes if "agent race" in n] == [
        "rank 0: agent race: its next step came 0.50 s after rank 1's failure on the simulated clock, inside the band of torchrun's SIGTERM"]
    cmp = compare_reports(sim, real)
    if not cmp.agree:  # (a real run whose SIGTERM came first agrees)
        races = named_races(sim, real, cmp)
        assert [(r.kind, r.rank, r.sim_ended) for r in races] == [("agent", 0, True)], format_comparison(cmp)


def test_a_step_past_the_band_is_the_agents_firm_verdict(tmp_path, monkeypatch):
    """Rank 0 sleeps 5 s (ff.py, the script real torchrun ended by SIGTERM in 10 of 10 runs):
    past the band, so the simulator names no race."""
    monkeypatch.chdir(tmp_path)
    sim = run_script(SCRIPT, nproc_per_node=2, timeout_s=120, stdout=subprocess.DEVNULL)
    assert sim.ranks[0].exit == terminated_words(1) and not [n for n in sim.notes if "agent race" in n]


@pytest.mark.parametrize(("how", "code", "forked"), [("os_exit", 1, True), ("sigkill", -9, True), ("os_exit", 1, False)],
                         ids=["os_exit", "sigkill", "os_exit-plain-launch"])
def test_after_a_failure_with_no_teardown_a_step_past_a_poll_is_the_agents_firm_verdict(
        tmp_path, monkeypatch, script_zygote, how, code, forked):
    """Rank 1 fails with no interpreter teardown (`os._exit(1)`, or it SIGKILLs itself): real
    torchrun's agent sees its end at the next poll (the SIGTERM 0.03-0.13 s after it, measured:
    `agent.sigterm_band`), so rank 0's next step 0.5 s later never comes: torchrun ends it in
    its sleep (exit -15), and the simulator ends it there too and names no race (the band after
    a raise, 0.06-4 s, would have: its failed process tears down first). Also without the fork
    server (`forked` False, as the command line runs): the real side's rank 1 used to end 2.4 s
    after its `os._exit` (its exit report's first FR dump imported torch._inductor:
    `rank.flight._no_inductor_lookup`), so rank 0 woke and lost it in the all-reduce instead."""
    args = ("0.5", how)
    assert torchrun(SCRIPT, 2, tmp_path, args) == {0: (-15, None), 1: (code, None)}
    monkeypatch.chdir(tmp_path)
    both = compare_script(SCRIPT, list(args), nproc_per_node=2, timeout_s=120, stdout=subprocess.DEVNULL,
                          zygotes=script_zygote if forked else None)
    sim = both.sim.report
    assert (sim.ranks[0].exit, sim.ranks[0].location.line) == (terminated_words(1), SLEEP)
    assert not [n for n in sim.notes if "agent race" in n], sim.notes
    cmp = compare_reports(sim, both.real.report)
    # (a SIGKILLed process leaves the real side no record of its operations: rank 1's trace and
    # line are unknown there, a difference of its own; rank 0's, the agent's, must agree)
    assert cmp.agree or (how == "sigkill" and {d.rank for d in cmp.differences} == {1}), format_comparison(cmp)
    assert both.real.report.ranks[0].exit == terminated_words(1)


def test_a_rank_that_lost_another_failed_rank_races_the_sigterm(tmp_path, monkeypatch, script_zygote):
    """examples/monitored_barrier_straggler.py: rank 2 raises; rank 0's monitored_barrier fails
    on its closure (at rank 2's end, before any SIGTERM: firm, no note); rank 1 loses rank 0 in
    turn, which on real Gloo comes only after rank 0's own teardown, while the SIGTERM comes a
    poll after rank 2's end: either first (real torchrun, 6 runs at load 5-9: rank 1 raised
    once, was SIGTERMed 5 times). The simulator keeps rank 1's loss and notes the race; the
    real side agrees or differs by that race alone. Before, no note: a real rank 1 SIGTERMed
    first (5 of 30 runs under load) was a model difference."""
    monkeypatch.chdir(tmp_path)
    both = compare_script(ROOT / "examples" / "monitored_barrier_straggler.py", [], nproc_per_node=3,
                          timeout_s=120, stdout=subprocess.DEVNULL, measure_compute=False, zygotes=script_zygote)
    sim, real = both.sim.report, both.real.report
    assert [(r.status, r.error.category) for r in sim.ranks] == [("error", "other"), ("error", "peer_lost"),
                                                                 ("error", "other")]
    raced = [n for n in sim.notes if "agent race" in n]
    assert [n.split(":")[0] for n in raced] == ["rank 1"] and "only once rank 0, which failed too, had torn down" in raced[0]
    cmp = compare_reports(sim, real)
    if not cmp.agree:
        assert [(r.kind, r.rank, r.sim_ended) for r in named_races(sim, real, cmp)] == [("agent", 1, False)], \
            format_comparison(cmp)


def test_lines_printed_after_a_computation_that_outlasts_the_agent_never_came(tmp_path, monkeypatch, script_zygote):
    """tests/scripts/compute_past_agent.py (3 ranks, `0.5 1.5 2`): ranks 1 and 2 time out at a
    barrier 0.5 s in while rank 0 computes alone, 1.5 s of CPU a chunk, printing after each.
    Real torchrun's agent SIGTERMs rank 0 in its first chunk: it printed nothing. The simulator
    stamped a printed line at the rank's clock of its last message (the barrier before the
    computation), so both lines stood in its report; a line now carries its thread's CPU time
    and comes after the compute before it, past the agent's instant: dropped, as on real Gloo.
    Left: where rank 0 ended (real: in its computation; the simulator: its last operation
    before the instant, the first barrier), as the report knows no line between messages."""
    monkeypatch.chdir(tmp_path)
    script = ROOT / "tests" / "scripts" / "compute_past_agent.py"
    both = compare_script(script, ["0.5", "1.5", "2"], nproc_per_node=3, timeout_s=120, stdout=subprocess.DEVNULL,
                          zygotes=script_zygote)
    sim, real = both.sim.report, both.real.report
    assert [r.status for r in sim.ranks] == ["error"] * 3 and sim.ranks[0].error.type == "SIGTERM"
    assert sim.ranks[0].output == real.ranks[0].output == []
    cmp = compare_reports(sim, real)
    if [d for d in cmp.differences if (d.field, d.rank) != ("location", 0)]:  # ranks 1 and 2's timeouts tie
        races = named_races(sim, real, cmp)
        assert races and {r.kind for r in races} <= {"tie", "agent"}, format_comparison(cmp)
    assert sim.ranks[0].location.line == line_of(script, "dist.barrier()  # every rank")


@pytest.mark.parametrize("how", ["run", "check_output", "system", "pool", "imap"])
def test_a_rank_waiting_for_its_child_process_is_late_for_its_peers(tmp_path, monkeypatch, script_zygote, how):
    """tests/scripts/child_wait_timeout.py (3 ranks, `1 4 HOW`): rank 0 waits 4 s for a command
    (subprocess.run, check_output, os.system; a Pool.map, a for loop over Pool.imap: its
    `__next__`, once left uncounted) while the others wait at a barrier with a 1 s timeout: they time out, torchrun's agent SIGTERMs rank 0 in its wait, on both sides, rank 0
    ending on the line of the command. The simulator counted none of the wait (it uses no CPU):
    every rank completed. `rank.childwait` tells the wait's wall time as a sleep."""
    monkeypatch.chdir(tmp_path)
    script = ROOT / "tests" / "scripts" / "child_wait_timeout.py"
    both = compare_script(script, ["1", "4", how], nproc_per_node=3, timeout_s=120, stdout=subprocess.DEVNULL,
                          zygotes=script_zygote)
    sim, real = both.sim.report, both.real.report
    assert [(r.status, r.error.category) for r in sim.ranks] == [("error", "killed"), ("error", "timeout"),
                                                                 ("error", "timeout")], sim.notes
    assert sim.ranks[0].output == [] and sim.ranks[0].location.line == line_of(script, {
        "run": "subprocess.run(", "check_output": "subprocess.check_output(", "system": "os.system(",
        "pool": "pool.map(", "imap": "for _ in pool.imap("}[how])
    cmp = compare_reports(sim, real)
    if not cmp.agree:  # the two timeouts tie: a tie race, or torchrun's SIGTERM first (both named)
        races = named_races(sim, real, cmp)
        assert races and {r.kind for r in races} <= {"tie", "agent"}, format_comparison(cmp)


def test_a_rank_waiting_for_slow_dataloader_workers_is_late_for_its_peers(tmp_path, monkeypatch, script_zygote):
    """tests/scripts/slow_loader_workers.py (2 ranks, `1 1.5`): rank 0's two DataLoader workers
    take 3 s of CPU for its first batch; rank 1 times out (1 s) in its first backward and
    torchrun's agent SIGTERMs rank 0 still waiting for that batch, on both sides: no input
    processed. The simulator counted none of the main thread's wait: both ranks completed.
    Since `rank.childwait` counted it, a batch yielded after the agent's instant (stamped on the
    rank's clock, `RankConn.batches_after`) is not counted either."""
    monkeypatch.chdir(tmp_path)
    both = compare_script(ROOT / "tests" / "scripts" / "slow_loader_workers.py", ["1", "1.5"], nproc_per_node=2,
                          timeout_s=120, stdout=subprocess.DEVNULL, zygotes=script_zygote)
    sim, real = both.sim.report, both.real.report
    assert [(r.status, r.error.category) for r in sim.ranks] == [("error", "killed"), ("error", "timeout")], sim.notes
    assert [r.inputs_processed for r in sim.ranks] == [0, 1] and sim.ranks[0].output == []
    cmp = compare_reports(sim, real)
    assert cmp.agree or {r.kind for r in named_races(sim, real, cmp)} == {"agent"}, format_comparison(cmp)


def test_a_child_wait_overlapping_a_side_threads_late_post_is_counted_once(tmp_path, monkeypatch, script_zygote):
    """tests/scripts/side_post_child_wait.py (2 ranks, `3 2 4.5`): rank 0's main thread waits 3 s
    for a child while its side thread sleeps 2 s and posts; rank 0 reaches the barrier (4.5 s
    timeout) 3 s in and both ranks complete on real Gloo. The simulator had the side post move
    the rank's clock to 2 s, then added the whole 3 s wait (told at its end) to that: 5 s, and
    rank 1's barrier timed out. The wait now ends 3 s after where it began."""
    monkeypatch.chdir(tmp_path)
    both = compare_script(ROOT / "tests" / "scripts" / "side_post_child_wait.py", ["3", "2", "4.5"], nproc_per_node=2,
                          timeout_s=120, stdout=subprocess.DEVNULL, zygotes=script_zygote)
    sim, real = both.sim.report, both.real.report
    assert [r.status for r in sim.ranks] == ["completed"] * 2, sim.notes
    assert 2.5 < sim.ranks[0].time < 4.5  # (the wait less the CPU its thread used meanwhile: under 3 s)
    cmp = compare_reports(sim, real)
    assert cmp.agree, format_comparison(cmp)
