"""`init_process_group` waits for the whole world (`simdist.script.rendezvous`), as real
Gloo's store rendezvous and full-mesh connect do: a late rank holds up the others' init, a
rank that never comes leaves them waiting (a hang the report explains) or, with init's
`timeout=`, ends their wait with the store's error; `new_group` waits for its members only.
Each script runs on the simulator and on real Gloo (`tests/scripts/init_waits_for_world.py`,
`new_group_members_only.py`), where real Gloo ends in seconds."""

from __future__ import annotations

import pytest

from simdist.agent_race import noted_agent_races
from simdist.compare import compare_reports, format_comparison
from simdist.engine.core import Engine
from simdist.races import rendezvous_races
from simdist.script.agent import terminated_words
from simdist.script.api import compare_script, run_script
from simdist.script.deadlines import fire_next
from simdist.script.generations import Generation
from simdist.script.launch import new_run_id, tagged_processes
from simdist.script.ranks import Block, RankConn, Timeline, ZeroCost
from simdist.script.rendezvous import INIT_WAIT, REFUSED, RendezvousMixin, _timed_waits
from simdist.script.stores import SERVER_GONE, rank0_hosts
from tests.conftest import ROOT, line_of

SCRIPTS = ROOT / "tests" / "scripts"
INIT = SCRIPTS / "init_waits_for_world.py"


class _Rendezvous(RendezvousMixin):
    """The coordinator's rendezvous alone: what it answers each rank, for a world of `size`."""

    def __init__(self, size: int, never: set[int] = frozenset()):
        self.gens = [Generation(1, size, Engine(size, {"WORLD": list(range(size))}, ZeroCost()), Timeline(ZeroCost()))]
        self.never_joins = lambda: set(never)
        self.answers: dict[int, dict] = {}

    def _send(self, conn, h):
        self.answers[conn.rank] = h

    def _skip(self, conn, target, *, told=False, at=None):  # (the script's clocks: `scriptclocks`, no process here)
        pass

    def arrive(self, rank: int, at: float = 0.0, to: float | None = None, clock: float = 0.0,
               host: tuple[str, int] | None = None) -> None:
        """`at`: when it entered init (wall time: a process's first init is judged on it);
        `host`: rank 0 hosts the store there (env://, mp.spawn), else the store was there."""
        conn = RankConn(None, rank=rank, clock=clock)  # type: ignore[arg-type]
        self.gens[0].by_rank[rank] = conn
        self._arrive(conn, self.gens[0], {"req": rank + 1, "at": at, "to": to, "host": host})

    def due(self, now: float) -> None:
        """The wall clock reads `now`: the first inits whose deadline passed end (`_init_timeouts`)."""
        for c, f in _timed_waits(self.gens[0]):
            if now - c.init_wait.at > f.after:
                self._init_failed(c, self.gens[0], f)


def test_init_answers_once_the_world_has_joined_at_the_last_arrival():
    rv = _Rendezvous(3)
    rv.arrive(0, to=2.0)
    rv.arrive(2, at=1.5)  # within rank 0's timeout: no error
    assert rv.answers == {}
    rv.arrive(1, clock=0.25)  # (a later generation's clock)
    assert sorted(rv.answers) == [0, 1, 2] and all(h["raise"] is None for h in rv.answers.values())
    assert {c.clock for c in rv.gens[0].by_rank.values()} == {0.25}


def test_a_rank_later_than_a_peers_timeout_fails_it_and_then_is_refused():
    """Rank 0 waits 0.5 s for rank 2, which comes 1 s late: rank 0's wait ran out
    first (the lowest rank missing at its deadline is named); rank 1, without a timeout, and
    rank 2 then find a peer whose process left: Gloo's connect is refused."""
    rv = _Rendezvous(3)
    rv.arrive(0, to=0.5)
    rv.arrive(1)
    rv.arrive(2, at=1.0)
    assert rv.answers[0]["raise"] == ("DistStoreError", "wait timeout after 500ms, keys: /default_pg/0//cpu//0/2")
    assert [rv.answers[r]["raise"][1].startswith(REFUSED) for r in (1, 2)] == [True, True]
    assert rv.gens[0].by_rank[0].clock == 0.5


def test_ranks_that_never_come_end_the_timed_waits_only():
    rv = _Rendezvous(4, never={1, 3})
    rv.arrive(0, to=1.0)
    rv.arrive(2)
    assert rv._unjoinable(rv.gens[0]) and fire_next(rv._init_deadlines())
    assert list(rv.answers) == [0] and rv.answers[0]["raise"][1].endswith("//cpu//0/1")
    assert rv.gens[0].by_rank[2].blocked() and not fire_next(rv._init_deadlines())  # the other waits for good: a hang


def test_a_rank_blocked_in_an_earlier_generation_cannot_come_to_the_next():
    """Rank 0 initialises again (generation 2) while rank 1's process is blocked in
    generation 1: rank 1 cannot come, so every live rank is blocked and the hang is proven
    (before, the watchdog was off while a generation waited for ranks)."""
    rv = _Rendezvous(2)
    gen1 = rv.gens[0]
    gen1.by_rank[1] = RankConn(None, rank=1, gen=gen1, block=Block([], 0.0, []))  # type: ignore[arg-type]
    gen2 = Generation(2, 2, Engine(2, {"gen2/WORLD": [0, 1]}, ZeroCost()), Timeline(ZeroCost()))
    rv.gens.append(gen2)
    conn = RankConn(None, rank=0, gen=gen2)  # type: ignore[arg-type]
    gen2.by_rank[0] = conn
    rv._arrive(conn, gen2, {"req": 1})
    assert rv.answers == {} and rv._unjoinable(gen2)
    gen1.by_rank[1].block = None  # running: it may still destroy its group and come
    assert not rv._unjoinable(gen2)


def _compare(zygote, args: list[str], nproc: int | None = 3, script=INIT):
    run_id = new_run_id()
    both = compare_script(script, args, nproc_per_node=nproc, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=zygote, timeout_s=60, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    return both.sim.report, both.real.report


@pytest.mark.real
def test_a_late_rank_holds_up_the_others_init_on_both_sides(script_zygote):
    """The last rank sleeps 1 s before init: the others' init returns only when it comes (real
    Gloo: about 1 s of wall time); every simulated clock starts at that last arrival (0)."""
    sim, real = _compare(script_zygote, ["sleeps1"])
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    assert [r.status for r in sim.ranks] == ["completed"] * 3
    assert {r.trace[0].t_issue for r in sim.ranks} == {0.0}
    assert real.timings["wall_s"] >= 1.0


@pytest.mark.real
@pytest.mark.parametrize("mode", ["exits", "raises", "sleeps2"])
def test_inits_timeout_ends_the_wait_for_a_missing_rank_with_the_stores_error(script_zygote, mode):
    """With `timeout=0.5` in init, ranks 0 and 1 raise the store's DistStoreError (category
    timeout) when the last rank exited before init, or comes 2 s late; both sides agree rank
    by rank. Torchrun-style, a failure makes torchrun's agent SIGTERM the others
    (`simdist.script.agent`), 0.5 s and 1.5 s before their next steps here, inside the band of
    real torchrun's SIGTERM (a race, named in the notes): the last rank that raised before
    init has ranks 0 and 1 ended in their init before their timeout (`raises`), and the late
    rank is ended in its sleep, before its init (`sleeps2`; before the agent it failed to
    connect to the peers that left)."""
    sim, real = _compare(script_zygote, [mode, "0.5"])
    c = compare_reports(sim, real)
    # the late rank's connect: refused, or a connect timeout on real Gloo (the ports decide)
    assert c.agree or [r.rank for r in rendezvous_races(sim, real, c)] == [2], \
        format_comparison(c)
    at = line_of(INIT, "dist.init_process_group(")
    for rep in (sim, real):
        if mode == "raises":
            assert [(r.status, r.error.type, r.exit) for r in rep.ranks[:2]] == \
                [("error", "SIGTERM", terminated_words(2))] * 2, rep.source
        else:
            assert [(r.status, r.error.type, r.error.category) for r in rep.ranks[:2]] == \
                [("error", "DistStoreError", "timeout")] * 2, rep.source
            assert "wait timeout after 500ms, keys: " in rep.ranks[0].error.message
        assert [r.location.line for r in rep.ranks[:2]] == [at, at]
        assert rep.ranks[2].error.type == "ScriptError"
        if mode == "sleeps2":
            assert rep.ranks[2].error.message.endswith("exit code -15 before calling init_process_group)")
        else:  # where the rank that never came left, on both sides
            assert rep.ranks[2].location.line == line_of(INIT, "sys.exit(0)" if mode == "exits" else "raise ")
    assert [r.time for r in sim.ranks[:2]] == ([0.13, 0.13] if mode == "raises" else [0.5, 0.5])
    assert _agent_raced(sim) == {"exits": [], "raises": [0, 1], "sleeps2": [2]}[mode]


def _agent_raced(rep) -> list[int]:
    """The ranks the simulated report names in the race of torchrun's agent (`simdist.agent_race`)."""
    return sorted(noted_agent_races(rep))


@pytest.mark.real
def test_an_inits_timeout_runs_out_on_time_while_the_late_rank_computes(script_zygote):
    """Rank 1 computes 1.5 s (busy: no message reaches the coordinator meanwhile) before its
    init; rank 0's init with `timeout=0.3` raises the store's error 0.3 s after it entered, as
    real Gloo's store wait does, not once rank 1 comes (the simulator's wait used to end only at
    that arrival: the rank's own printed line said so); rank 1 then failed to connect, and now,
    torchrun-style, is ended by the agent's SIGTERM first (`simdist.script.agent`)."""
    sim, real = _compare(script_zygote, ["computes1.5", "0.3"], nproc=2)
    c = compare_reports(sim, real)
    assert c.agree or [r.rank for r in rendezvous_races(sim, real, c)] == [1], \
        format_comparison(c)
    for rep in (sim, real):
        assert (rep.ranks[0].error.type, rep.ranks[0].error.category) == ("DistStoreError", "timeout"), rep.source
        assert rep.ranks[0].output == ["0 raised before the last rank came"], rep.source
        # torchrun's agent ends rank 1 before its init, 1.2 s later (inside the band: a named race)
        assert rep.ranks[1].error.message.endswith("exit code -15 before calling init_process_group)"), rep.source
    assert sim.ranks[0].time == 0.3
    assert _agent_raced(sim) == [1]


@pytest.mark.real
@pytest.mark.parametrize("mode", ["exits", "subexits"])
def test_a_rank_that_exits_before_init_leaves_the_others_waiting_there(script_zygote, mode):
    """No timeout: the simulator proves the hang at once, each waiting rank at its init line,
    says which rank never came, and how real torch ends each wait: at its default timeout, 30
    min for Gloo, with the store's error (measured with torch's default patched to 1 s: the
    same error as `timeout=` gives; 30 min is not run). `subexits`: the rank first runs a child
    interpreter, which inherits its environment (and so the rank layer) and exits first; the
    report is still the rank's own exit, not the child's."""
    run_id = new_run_id()
    rep = run_script(INIT, [mode], nproc_per_node=3, backend="gloo", run_id=run_id, measure_compute=False,
                     timeout_s=60, zygote=script_zygote("sim"))
    assert tagged_processes(run_id) == []
    at = line_of(INIT, "dist.init_process_group(")
    assert [r.status for r in rep.ranks] == ["hang", "hang", "error"]
    assert [(r.exit, r.location.line) for r in rep.ranks[:2]] == [(INIT_WAIT, at)] * 2
    assert "exit code 0 before calling init_process_group" in rep.ranks[2].error.message
    # where the rank that never came left: its process tells the coordinator as it exits
    assert (rep.ranks[2].exit, rep.ranks[2].location.line) == ("sys.exit(0) before init_process_group",
                                                               line_of(INIT, "sys.exit(0)"))
    assert any("rank(s) [0, 1] wait in init_process_group for the whole world of 3" in n
               and "rank(s) [2] ended before calling it; rank 2 sys.exit(0) before init_process_group at "
               f"init_waits_for_world.py:{line_of(INIT, 'sys.exit(0)')}" in n for n in rep.notes), rep.notes
    # how real torch ends the wait: its default timeout (30 min for Gloo) runs out in the store
    for r in (0, 1):
        assert f"init: on real torch rank {r}'s wait ends after its default timeout (30 min): DistStoreError: " \
               "wait timeout after 1800000ms, keys: /default_pg/0//cpu//0/2" in rep.notes, rep.notes
    assert rep.timings["wall_s"] < 30


@pytest.mark.real
def test_new_group_waits_for_its_members_only(script_zygote):
    """Without use_local_synchronization a rank outside the group need not call new_group:
    ranks 0 and 1 make it and all-reduce on it while the last rank sleeps 1 s (measured on
    real Gloo; torch 2.13 has no world barrier there unless TORCH_DIST_INIT_BARRIER=1)."""
    sim, real = _compare(script_zygote, [], script=SCRIPTS / "new_group_members_only.py")
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    side = [r.trace[0] for r in sim.ranks[:2]]
    assert [e.op for e in side] == ["all_reduce", "all_reduce"] and all(e.t_done < 1.0 for e in side)
    assert all(r.trace[-1].op == "barrier" and r.trace[-1].t_done >= 1.0 for r in sim.ranks)


SKIPS = SCRIPTS / "new_group_member_skips.py"


@pytest.mark.real
@pytest.mark.parametrize(("mode", "statuses", "instead"), [
    ("barrier", ["hang", "hang"], "it waits at new_group_member_skips.py:{barrier}"),
    ("exits", ["hang", "completed"], "its process left (sys.exit(0) at new_group_member_skips.py:{exit})"),
])
def test_a_member_that_never_calls_new_group_is_a_hang_on_both_sides(script_zygote, mode, statuses, instead):
    """Rank 1 never calls new_group (it waits in a barrier of the world, or exits): rank 0
    waits in the group's creation, on real Gloo at the store (torch: 30 min). The simulator
    proves the hang at once (rank 0's wait is a block, `groups`), where it waited for its
    watchdog before (30 s with --timeout 30); the report names the wait, its line and who
    never came."""
    sim, real = _compare(script_zygote, [mode], nproc=2, script=SKIPS)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    at = line_of(SKIPS, "dist.new_group(")
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == statuses and rep.ranks[0].location.line == at, rep.source
    assert sim.ranks[0].exit == "waiting in new_group" and sim.timings["wall_s"] < 30, sim.timings
    lines = {"barrier": line_of(SKIPS, "dist.barrier()", after='mode == "barrier"'), "exit": line_of(SKIPS, "sys.exit(0)")}
    assert f"new_group: rank(s) [0] wait in new_group(ranks=[0, 1]) at new_group_member_skips.py:{at} for every " \
           f"member (Gloo's full-mesh connect at the c10d store): rank 1 never called it: " \
           f"{instead.format(**lines)}" in sim.notes, sim.notes


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_new_groups_timeout_ends_the_wait_for_a_missing_member_with_the_stores_error(script_zygote, nproc):
    """Every rank joins a barrier of the world; then the last one exits and the others call
    new_group(timeout=0.5 s): each raises the store's error T after it entered (its wait for
    the missing member's address), on both sides with the same wording but the store's prefix
    (the real side's launcher names its default group's store apart). Before, the simulator
    took the barrier's completion, which the new_group request's claim did not count, for a
    thread that could still post: no hang was proven, the timeout never ran out, and the run
    ended at the watchdog (`rank.client.Client.request`)."""
    sim, real = _compare(script_zygote, ["exits", "0.5"], nproc=nproc, script=SKIPS)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["error"] * (nproc - 1) + ["completed"], rep.source
        assert all([e.op for e in r.trace] == ["barrier"] for r in rep.ranks), rep.source
        for r in rep.ranks[:-1]:
            assert r.error.type == "DistStoreError" and r.error.message.startswith(
                "wait timeout after 500ms, keys: /") and r.error.message.endswith(f"/0//1//cpu//0/{nproc - 1}")
    # entered at the barrier's end (the simulated clocks), raised T later
    assert all(r.time == pytest.approx(r.trace[0].t_done + 0.5) for r in sim.ranks[:-1]), sim.ranks
    assert sim.timings["wall_s"] < 30, sim.timings


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_a_side_threads_collective_does_not_hide_a_wait_in_new_group(script_zygote, nproc):
    """The main thread waits in new_group(timeout=1 s) for the last rank, which exits; a side
    thread of each waiting rank all-reduces meanwhile. On both sides each waiting rank raises
    the store's error at its entry + 1 s. Before, the side thread's operation ended the main
    thread's wait on the coordinator (`RankConn.block`: one per rank): no hang was proven, the
    group's timeout never ran out, the simulated run ended at its watchdog."""
    script = SCRIPTS / "new_group_side_thread.py"
    run_id = new_run_id()
    both = compare_script(script, [], nproc_per_node=nproc, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=script_zygote, timeout_s=20, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    sim, real = both.sim.report, both.real.report
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["error"] * (nproc - 1) + ["completed"], rep.source
        for r in rep.ranks[:-1]:
            assert r.error.type == "DistStoreError" and r.error.message.startswith(
                "wait timeout after 1000ms, keys: /") and r.error.message.endswith(f"/0//1//cpu//0/{nproc - 1}")
    assert all(r.time == pytest.approx(1.0, abs=0.1) for r in sim.ranks[:-1]), sim.ranks
    assert sim.timings["wall_s"] < 15, sim.timings


@pytest.mark.real
def test_side_threads_waiting_while_new_group_returns_is_no_hang(script_zygote):
    """Each rank's side thread waits in a receive that its peer's main thread sends after its
    new_group returns: the replies wake the main threads, and the side threads' waits must
    not make the ranks look blocked meanwhile (`RankConn.answered`); both sides complete."""
    script = SCRIPTS / "new_group_side_thread.py"
    run_id = new_run_id()
    both = compare_script(script, ["exchange"], nproc_per_node=3, backend="gloo", run_id=run_id,
                          measure_compute=False, zygotes=script_zygote, timeout_s=20, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    assert [r.status for r in both.sim.report.ranks] == ["completed"] * 3, both.sim.report.notes


@pytest.mark.real
def test_members_waiting_for_a_late_member_say_so_on_both_sides(script_zygote, monkeypatch):
    """3 ranks, the last sleeps 2 s before its new_group: ranks 0 and 1 wait in the group's
    creation meanwhile (on real Gloo at the store), and each side says so in a status line
    (`initwatch._groups_gather`, after `STATUS_AFTER_S`, shortened here), in the words init's
    lines use: who waits where, for which group, who has not come, and what real torch does
    with the waits; then the run completes. Before, a long wait in new_group said nothing."""
    from simdist.script import initwatch

    monkeypatch.setattr(initwatch, "STATUS_AFTER_S", 0.3)
    lines: list[str] = []
    run_id = new_run_id()
    both = compare_script(SKIPS, ["sleeps2"], nproc_per_node=3, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=script_zygote, timeout_s=60, hang_after_s=0.3, status=lines.append)
    assert tagged_processes(run_id) == []
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    assert [r.status for r in both.real.report.ranks] == ["completed"] * 3
    who = (f"rank(s) [0, 1] waiting in new_group at new_group_member_skips.py:{line_of(SKIPS, 'dist.new_group(')} "
           "for the group of ranks [0, 1, 2]; rank(s) [2] never came; ")
    for side, torch in (("simulated side", "real torch: rank 0: DistStoreError: wait timeout after 1800000ms, keys: "
                         "/default_pg/0//1//cpu//0/2; rank 1: DistStoreError: wait timeout after 1800000ms, keys: "
                         "/default_pg/0//1//cpu//0/2 after 30 min"),
                        ("real side", "torch ends these waits after 30 min (their timeout)")):
        said = [x for x in lines if x.startswith(f"new_group: {side}: waiting ")]
        assert said and f" s: {who}{torch}; Ctrl-C ends the run with a report" in said[0], lines


@pytest.mark.real
def test_a_member_later_than_a_peers_group_timeout_fails_it_and_then_is_refused(script_zygote):
    """new_group(timeout=0.5 s), rank 1 sleeps 2 s first: on real Gloo rank 0 raises the
    store's error at 0.5 s and leaves; rank 1 then finds rank 0's address and its connect fails
    (refused, or timed out: the ports' race, `simdist.races`). The simulated side, on its
    clocks: rank 0 at 0.5 s, rank 1 refused (before, both completed); torchrun-style, the
    agent's SIGTERM ends rank 1 in its sleep first."""
    run_id = new_run_id()
    rep = run_script(SKIPS, ["sleeps2", "0.5"], nproc_per_node=2, backend="gloo", timeout_s=60, run_id=run_id,
                     measure_compute=False, zygote=script_zygote("sim"))
    assert tagged_processes(run_id) == []
    r0, r1 = rep.ranks
    assert (r0.error.type, r0.error.message, r0.time) == (
        "DistStoreError", "wait timeout after 500ms, keys: /default_pg/0//1//cpu//0/1", pytest.approx(0.5))
    # torchrun-style, rank 0's failure makes the agent end rank 1 in its sleep, 1.5 s before its
    # new_group would have been refused: inside the band of real torchrun's SIGTERM, a named race
    assert (r1.error.type, r1.exit, r1.location.line) == ("SIGTERM", terminated_words(0), line_of(SKIPS, "time.sleep("))
    assert _agent_raced(rep) == [1]


def test_a_first_init_is_late_by_the_wall_clock_a_later_one_by_the_simulated_clock():
    """Before a process's first init nothing is simulated: rank 1 entering init 1.5 s after
    rank 0 (its sleeps, its compute or its poll for a file rank 0 writes alike) outlasts
    rank 0's 1 s timeout; entering at the same wall time it does not, whatever it slept.
    A later init (no wall time: a generation after destroy) is judged on the clocks."""
    late = _Rendezvous(2)
    late.arrive(0, at=100.0, to=1.0)
    late.arrive(1, at=101.5)
    assert late.answers[0]["raise"][0] == "DistStoreError" and late.gens[0].by_rank[0].clock == 1.0
    together = _Rendezvous(2)
    together.arrive(0, at=100.0, to=1.0)
    together.arrive(1, at=100.2)
    assert [together.answers[r]["raise"] for r in (0, 1)] == [None, None]
    later = _Rendezvous(2)
    for r, clock in ((0, 3.0), (1, 4.5)):
        conn = RankConn(None, rank=r, clock=clock)  # type: ignore[arg-type]
        later.gens[0].by_rank[r] = conn
        later._arrive(conn, later.gens[0], {"req": r + 1, "at": None, "to": 1.0})
    assert later.answers[0]["raise"][0] == "DistStoreError" and later.gens[0].by_rank[0].clock == 4.0


HOST = ("localhost", 12355)  # where the script's env:// says rank 0 hosts the store
SPAWN = SCRIPTS / "spawn_rank_missing.py"


def test_which_store_an_init_makes():
    """Rank 0 hosts the store for env:// and tcp:// unless torchrun's agent hosts it (its
    default) or the script hands init a store; file:// needs no host."""
    env = {"MASTER_ADDR": "localhost", "MASTER_PORT": "12355"}
    assert rank0_hosts(None, False, env) == HOST
    assert rank0_hosts("env://", False, env) == HOST
    assert rank0_hosts("tcp://10.0.0.1:23456", False, {}) == ("10.0.0.1", 23456)
    assert rank0_hosts(None, False, {**env, "TORCHELASTIC_USE_AGENT_STORE": "True"}) is None
    assert rank0_hosts(None, True, env) is None
    assert rank0_hosts("file:///tmp/x", False, env) is None


def test_rank0_hosting_waits_for_every_client_in_whole_seconds():
    """Rank 1 never comes: rank 0's store server gives up floor(T) + 1 s after it entered
    (measured 1 s for T = 0.5, 2 s for 1 and 1.5, 4 s for 3), counting itself as joined."""
    for t, waited in ((0.5, 1.0), (1.5, 2.0), (3.0, 4.0)):
        rv = _Rendezvous(2)
        rv.arrive(0, at=100.0, to=t, host=HOST)
        rv.due(100.0 + waited - 0.01)
        assert rv.answers == {}
        rv.due(100.0 + waited + 0.01)
        assert rv.answers[0]["raise"] == ("DistStoreError", f"Timed out after {int(waited)} seconds waiting for "
                                                            "clients. 1/2 clients joined.")
        assert rv.gens[0].by_rank[0].clock == waited


def test_a_client_waits_for_rank_0s_address_while_rank_0_waits_for_clients():
    """Rank 2 never comes: rank 1 connected, so it waits in Gloo's connect for rank 0's
    address (not there while rank 0 waits for its clients) and raises T after it entered
    naming rank 0; rank 3, whose timeout outlasts rank 0's wait, loses the store when rank
    0's server closes."""
    rv = _Rendezvous(4)
    rv.arrive(0, at=100.0, to=1.0, host=HOST)
    rv.arrive(1, at=100.2, to=1.0, host=HOST)
    rv.arrive(3, at=100.2, to=5.0, host=HOST)
    rv.due(101.3)
    assert list(rv.answers) == [1]
    assert rv.answers[1]["raise"] == ("DistStoreError", "wait timeout after 1000ms, keys: /default_pg/0//cpu//0/0")
    rv.due(102.1)
    assert rv.answers[0]["raise"][1].endswith("3/4 clients joined.")  # rank 1 had joined: it counts
    assert rv.answers[3]["raise"] == SERVER_GONE and rv.gens[0].by_rank[3].clock == pytest.approx(1.8)


def test_without_rank_0_the_others_find_no_store_and_a_late_rank_finds_it_closed():
    rv = _Rendezvous(3)
    rv.arrive(1, at=100.0, to=1.0, host=HOST)
    rv.due(101.9)
    assert rv.answers == {}  # the connect retries: about 2 T (measured 1.6 to 2.7 s for T = 1 s)
    rv.due(102.1)
    assert rv.answers[1]["raise"] == ("DistNetworkError", "The client socket has timed out after 1000ms while "
                                                          "trying to connect to (localhost, 12355).")
    late = _Rendezvous(2)
    late.arrive(0, at=100.0, to=0.5, host=HOST)
    late.due(101.1)
    late.arrive(1, at=101.5, to=0.5, host=HOST)  # rank 0's server closed at 101.0
    assert list(late.answers) == [0]  # not refused at once: its own connect gives up
    late.due(102.6)
    assert late.answers[1]["raise"][0] == "DistNetworkError"


def test_rank0_hosting_answers_everyone_once_the_world_came_in_time():
    rv = _Rendezvous(3)
    rv.arrive(1, at=100.0, to=1.0, host=HOST)  # before rank 0: its connect retries until the server is up
    rv.arrive(0, at=100.5, to=1.0, host=HOST)
    rv.arrive(2, at=101.2, to=1.0, host=HOST)  # within rank 0's 2 s wait and rank 1's key wait (100.5 + 1)
    assert [rv.answers[r]["raise"] for r in range(3)] == [None] * 3


def _spawned(zygote, args: list[str]):
    """SPAWN's ranks, started by the script itself (mp.spawn: no torchrun, no agent store)."""
    return _compare(zygote, args, nproc=None, script=SPAWN)


@pytest.mark.real
@pytest.mark.parametrize("start", ["fork", pytest.param("spawn", marks=pytest.mark.slow)])
def test_mp_spawn_rank_0_waits_for_clients_and_a_client_for_rank_0_on_both_sides(script_zygote, start):
    """mp.spawn, env:// (rank 0 hosts the store), rank 2 of 3 exits before init, T = 0.5 s:
    rank 1 raises the store's error naming rank 0 (whose address is not there while rank 0
    waits for its clients), then mp.spawn SIGTERMs rank 0 in its init; before, the simulator
    had ranks 0 and 1 both name rank 2, as torchrun's agent store would. `fork`: the same
    process context as mp.spawn's, without a torch import a rank (40 s of a loaded CI less).
    `spawn` (T = 1 s): a rank's interpreter start and torch import take seconds on a loaded
    host, and rank 0's own deadline, floor(T) + 1 after it entered, comes first when rank 1
    entered more than 1 s after it: on either side rank 0 then raises its wait for clients
    instead of dying of mp.spawn's SIGTERM (the order is the starts', not the program's)."""
    sim, real = _spawned(script_zygote, ["exits", "2", "3", "0.5" if start == "fork" else "1", start])
    c = compare_reports(sim, real)
    raced = start == "spawn" and {d.rank for d in c.differences} == {0} and \
        {rep.ranks[0].error.type for rep in (sim, real)} <= {"DistStoreError", "Killed"}
    assert c.agree or raced, format_comparison(c)
    at = line_of(SPAWN, "dist.init_process_group(")
    for rep in (sim, real):
        r1 = rep.ranks[1]
        assert (r1.status, r1.error.type, r1.location.line) == ("error", "DistStoreError", at), rep.source
        assert r1.error.message.startswith("wait timeout after "), rep.source
        assert r1.error.message.endswith("ms, keys: /default_pg/0//cpu//0/0"), rep.source
        if rep.ranks[0].error.type == "DistStoreError":  # its own deadline first (`spawn`, see above)
            assert rep.ranks[0].error.message.endswith("waiting for clients. 2/3 clients joined."), rep.source
        else:  # killed by mp.spawn once rank 1 raised
            assert start == "spawn" or rep.ranks[0].error.category == "killed", rep.source
    assert sim.ranks[1].time >= 0.5


@pytest.mark.real
@pytest.mark.parametrize("case", [pytest.param(["exits", "0", "2", "0.5", "fork"], id="host-missing"),
                                  pytest.param(["exits", "1", "2", "0.5", "fork"], id="client-missing",
                                               marks=pytest.mark.slow)])
def test_mp_spawn_a_missing_rank_fails_the_other_as_real_gloo_does(script_zygote, case):
    """host-missing: rank 0 never hosts the store, rank 1's connect gives up
    (DistNetworkError naming the address); client-missing: rank 0's store server gives up
    waiting for clients after floor(T) + 1 = 1 s. The real side's rank 0 hosts at a port the
    launcher picked (not the script's hard-coded 12355), the simulator names the script's."""
    sim, real = _spawned(script_zygote, case)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    r = 1 if case[1] == "0" else 0
    for rep in (sim, real):
        e = rep.ranks[r].error
        assert e is not None, rep.source
        if r == 1:
            assert (e.type, e.message.split(" while")[0]) == (
                "DistNetworkError", "The client socket has timed out after 500ms"), rep.source
        else:
            assert (e.type, e.message) == (
                "DistStoreError", "Timed out after 1 seconds waiting for clients. 1/2 clients joined."), rep.source
    assert sim.ranks[r].time == 1.0  # 2 T for the connect, floor(T) + 1 for the wait for clients


def test_a_first_init_without_timeout_ends_at_torchs_default_on_the_wall_clock():
    """A script that starts its own ranks (mp.spawn) and a rank that never comes: nothing tells
    the simulator that no process will still become that rank, so the others wait as real
    torch's do, until its default timeout (30 min for Gloo) ends their wait on the wall clock
    with the store's error, at simulated time 1800 s."""
    import time

    rv = _Rendezvous(2)
    rv.arrive(1, at=time.time() - 1799.0)
    rv._init_timeouts()
    assert rv.answers == {}
    rv.gens[0].entered[1].at -= 2.0
    rv._init_timeouts()
    assert rv.answers[1]["raise"] == ("DistStoreError", "wait timeout after 1800000ms, keys: /default_pg/0//cpu//0/0")
    assert rv.gens[0].by_rank[1].clock == 1800.0


def test_the_port_of_a_rank_0_hosted_store_is_held_for_the_run_and_rank_0_can_bind_it():
    """`launch.host_port` picks the port and holds it until the run ends: another run's pick
    (a plain bind) cannot take it meanwhile, and rank 0's TCPStore, libuv's or torch's own,
    still binds and serves it."""
    import datetime
    import socket

    from torch.distributed import TCPStore

    from simdist.script.launch import host_port

    for libuv in (True, False):
        held = host_port()
        port = held.getsockname()[1]
        try:
            with socket.socket() as other, pytest.raises(OSError):
                other.bind(("127.0.0.1", port))
            server = TCPStore("127.0.0.1", port, 2, True, datetime.timedelta(seconds=5), wait_for_workers=False,
                              use_libuv=libuv)
            TCPStore("127.0.0.1", port, 2, False, datetime.timedelta(seconds=5), use_libuv=libuv).set("k", "v")
            assert server.get("k") == b"v"
        finally:
            held.close()


@pytest.mark.parametrize(("method", "environ"), [
    ("env://", {"MASTER_PORT": "12355"}), ("env://", {"MASTER_ADDR": "localhost"}),
    ("env://", {"MASTER_ADDR": "", "MASTER_PORT": "12355"}), ("env://", {"MASTER_ADDR": "localhost", "MASTER_PORT": "x"}),
    ("env://", {"MASTER_ADDR": "localhost", "MASTER_PORT": "70000"}), ("tcp://localhost", {}),
    ("tcp://localhost:99999", {}),
])
def test_an_address_torchs_rendezvous_cannot_read_raises_its_error(monkeypatch, method, environ):
    """What torch's own rendezvous raises before it makes any store (run here, it needs no
    peer), the rank layer raises from the same environment, in either mode, whoever hosts."""
    from torch.distributed.rendezvous import rendezvous

    for var in ("MASTER_ADDR", "MASTER_PORT", "TORCHELASTIC_USE_AGENT_STORE"):
        monkeypatch.delenv(var, raising=False)
    for var, value in environ.items():
        monkeypatch.setenv(var, value)
    with pytest.raises(ValueError) as torchs:
        next(rendezvous(method, rank=0, world_size=1))
    for agent in ("False", "True"):
        with pytest.raises(ValueError) as ours:
            rank0_hosts(method, False, {**environ, "TORCHELASTIC_USE_AGENT_STORE": agent})
        assert str(ours.value) == str(torchs.value)
    assert rank0_hosts(method, True, environ) is None  # a store= argument: no rendezvous


def test_a_script_without_master_addr_fails_its_init_as_torch_does(script_zygote):
    """Its rank raises torch's ValueError in init_process_group, before it joins any world, so
    the run is one that never initialised a process group (one line, exit 2, with the hint
    that a torchrun script wants --nproc-per-node). Before, the simulator (and `simdist
    real`, whose rank 0 hosts at the launcher's port) completed the run that torch ends there."""
    from simdist.errors import ScriptError

    for args in ([], ["x"]):
        run_id = new_run_id()
        with pytest.raises(ScriptError, match=r"never initialised a process group: .*exit codes \[1\]"):
            run_script(SCRIPTS / "init_no_master_addr.py", args, nproc_per_node=None, backend="gloo", run_id=run_id,
                       measure_compute=False, timeout_s=60, zygote=script_zygote("sim"))
        assert tagged_processes(run_id) == []


def _watched(zygote, args: list[str], hang_after_s: float = 0.5):
    """The simulated side of `spawn_rank_missing.py ARGS` with its status lines (`initwatch`)."""
    from simdist.script.api import execute

    run_id, lines = new_run_id(), []
    run = execute(SPAWN, args, nproc_per_node=None, backend="gloo", run_id=run_id, measure_compute=False,
                  zygote=zygote("sim"), timeout_s=60, hang_after_s=hang_after_s, status=lines.append)
    assert tagged_processes(run_id) == []
    return run.report, lines


def test_mp_spawn_a_rank_that_exits_before_init_is_a_hang_within_seconds(script_zygote):
    """mp.spawn, env://, no timeout=: rank 2 exits before init, ranks 0 and 1 wait in init, and
    the script's process waits in mp.spawn's join with no timer: real torch sits 30 min, then
    raises the store's errors; the simulator says so as a hang after --hang-after, not 30 min
    of silence, naming the ranks, their line, the process that left and its line."""
    report, _ = _watched(script_zygote, ["exits", "2", "3", "none", "fork"])
    at, left = line_of(SPAWN, "dist.init_process_group("), line_of(SPAWN, "sys.exit(0)")
    assert [r.status for r in report.ranks[:2]] == ["hang", "hang"]
    assert [r.location.line for r in report.ranks[:2]] == [at, at]
    early = next(n for n in report.notes if n.startswith("hang found early"))
    assert "hang (real torch: rank 0: DistStoreError: Timed out after 1801 seconds waiting for clients. 2/3 " \
           "clients joined.; rank 1: DistStoreError: wait timeout after 1800000ms, keys: /default_pg/0//cpu//0/0 " \
           "after 30 min)" in early, early
    assert f"rank(s) [0, 1] waiting in init_process_group at spawn_rank_missing.py:{at} for a world of 3; " \
           "rank(s) [2] never came; a process of the run (pid " in early, early
    assert f"mp.spawn's process 2) sys.exit(0) before init_process_group at spawn_rank_missing.py:{left}" in early
    assert "wait with no timer (the script's own in mp.spawn's join" in early, early
    assert report.timings["hang_detect_s"] < 3.0 and report.timings["wall_s"] < 20.0, report.timings


def test_mp_spawn_a_late_rank_is_waited_for_and_said_to_be_running(script_zygote, monkeypatch):
    """A rank still sleeping before its init is a process that may yet come: no hang verdict,
    a status line that names it (shown after `STATUS_AFTER_S`, shortened here), and the run
    completes once it comes."""
    from simdist.script import initwatch

    monkeypatch.setattr(initwatch, "STATUS_AFTER_S", 0.3)
    report, lines = _watched(script_zygote, ["sleeps2.5", "2", "3", "none", "fork"], hang_after_s=0.3)
    assert report.outcome == "completed", report.notes
    assert lines and "rank(s) [0, 1] waiting in init_process_group" in lines[0], lines
    assert "still run or sleep: they may yet call init" in lines[0] and "Ctrl-C ends the run with a report" \
        in lines[0], lines


@pytest.mark.real
def test_mp_spawn_a_rank_that_exits_before_init_is_a_hang_in_seconds_on_both_sides(script_zygote):
    """The same run on real Gloo: its ranks wait at the store (torch: 30 min); once every one
    has stalled and no other process of the run could become rank 2 (the script's own waits
    in mp.spawn's join with no timer, `initwatch._look`), the stall rule's verdict, not the
    watchdog's. Both sides: a hang of ranks 0 and 1 at init's line, and they agree."""
    sim, real = _spawned(script_zygote, ["exits", "2", "3", "none", "fork"])
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    at = line_of(SPAWN, "dist.init_process_group(")
    for rep in (sim, real):
        assert [r.status for r in rep.ranks[:2]] == ["hang", "hang"], rep.source
        assert [r.location.line for r in rep.ranks[:2]] == [at, at], rep.source
        assert rep.timings["hang_detect_s"] < 10 and rep.timings["wall_s"] < 40, (rep.source, rep.timings)
    early = next(n for n in real.notes if n.startswith("hang found early (--hang-after 0.3 s, not the 60 s"))
    assert "rank(s) [2] never called init_process_group; a process of the run (pid " in early, early
    assert "no other process of the run could bring them: process(es) [" in early, early


@pytest.mark.real
def test_mp_spawn_a_late_rank_is_not_a_hang_on_real_gloo(script_zygote, monkeypatch):
    """Rank 2 sleeps 2 s (several settle periods) before its init while ranks 0 and 1 stall at
    the store: a process of the run still sleeps with a timer, so it may yet come: no verdict.
    Meanwhile the real side says what it waits for, as the simulated side does (`initwatch`,
    shown after `STATUS_AFTER_S`, shortened here): each rank's store wait and its line."""
    from simdist.script import initwatch
    from simdist.script.api import execute

    monkeypatch.setattr(initwatch, "STATUS_AFTER_S", 0.3)
    lines: list[str] = []
    rep = execute(SPAWN, ["sleeps2", "2", "3", "none", "fork"], nproc_per_node=None, backend="gloo",
                  timeout_s=60, mode="gloo", hang_after_s=0.3, run_id=(run_id := new_run_id()),
                  measure_compute=False, zygote=script_zygote("gloo"), status=lines.append).report
    assert tagged_processes(run_id) == []
    assert rep.outcome == "completed" and not any("hang" in n for n in rep.notes), rep.notes
    assert rep.timings["wall_s"] >= 2.0
    at = line_of(SPAWN, "dist.init_process_group(")
    assert lines and lines[0].startswith("init: waiting ") and f" s: rank(s) [0, 1] waiting in init_process_group at " \
        f"spawn_rank_missing.py:{at} for a world of 3; rank(s) [2] never came; " in lines[0], lines
    assert "still run or sleep: they may yet call init" in lines[0], lines
    assert "torch ends these waits after 30 min (their timeout); Ctrl-C ends the run with a report" in lines[0], lines


@pytest.mark.slow
def test_ctrl_c_while_ranks_wait_in_init_gives_the_report_and_ends_every_process():
    """`simdist run` of an mp.spawn script whose rank 2 sleeps before init (no verdict: it may
    come): the status line on stderr, then Ctrl-C: the report as it stood, exit 130, and no
    process of the run left. ~10 s: an interpreter and a torch import per rank, and the
    status line's 5 s."""
    import os
    import signal
    import subprocess
    import sys
    import uuid

    from simdist.procs import processes_with_env
    from tests.conftest import TEST_TAG

    tag = uuid.uuid4().hex
    p = subprocess.Popen([sys.executable, "-m", "simdist", "run", str(SPAWN), "--", "sleeps120", "2", "3", "none",
                          "fork"], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, cwd=ROOT,
                         env={**os.environ, TEST_TAG: tag})
    try:
        status = p.stderr.readline()  # the first line the CLI writes there is the status line
        assert status.startswith("init: waiting") and "rank(s) [2] never came" in status, status
        assert "still run or sleep: they may yet call init" in status, status
        p.send_signal(signal.SIGINT)
        out, rest = p.communicate(timeout=60)
    finally:
        p.kill()
    assert p.returncode == 130, (out[-800:], rest[-800:])
    assert "interrupted (Ctrl-C)" in out and "rank 0 is waiting in init_process_group" in out, out
    assert processes_with_env(TEST_TAG, tag) == []


@pytest.mark.parametrize(("code", "untimed"), [
    ("import time; time.sleep(60)", False),  # a late rank sleeping: clock_nanosleep, a timer
    ("import select, os; r, w = os.pipe(); select.select([r], [], [], 60)", False),
    ("import select, os; r, w = os.pipe(); p = select.poll(); p.register(r); p.poll(60000)", False),
    ("import threading; threading.Event().wait(60)", False),
    ("import select, os; r, w = os.pipe(); select.select([r], [], [])", True),
    ("import threading; threading.Event().wait()", True),
])
def test_only_a_wait_no_timer_ends_counts_as_untimed(code, untimed):
    """`initwatch.untimed_wait` reads /proc/PID/task/TID/syscall: a process sleeping or
    polling with a timeout may yet start the missing rank, so it never counts as waiting for
    good (the early hang verdict needs every other process of the run so); where the
    syscall table has no entry for this machine, nothing counts (fail safe)."""
    import subprocess
    import sys
    import time

    from simdist.script import initwatch

    proc = subprocess.Popen([sys.executable, "-c", f"print(flush=True); {code}"], stdout=subprocess.PIPE)
    try:
        proc.stdout.readline()  # about to wait
        deadline = time.monotonic() + (5 if untimed else 0.5)  # (timed: half a second of samples, none untimed)
        seen = False
        while time.monotonic() < deadline and not seen:
            time.sleep(0.02)
            seen = initwatch.untimed_wait(proc.pid)
        assert seen is (untimed and bool(initwatch._UNTIMED))
    finally:
        proc.kill()
        proc.wait()
