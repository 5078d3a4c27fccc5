"""`init_process_group` waits for the whole world (`simdist.script.rendezvous`), as real
Gloo's store rendezvous and full-mesh connect do: a late rank holds up the others' init, a
rank that never comes leaves them waiting (a hang the report explains) or, with init's
`timeout=`, ends their wait with the store's error; `new_group` waits for its members only.
Each script runs on the simulator and on real Gloo (`tests/scripts/init_waits_for_world.py`,
`new_group_members_only.py`), where real Gloo ends in seconds."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.engine.core import Engine
from simdist.races import rendezvous_races
from simdist.script.api import compare_script, run_script
from simdist.script.generations import Generation
from simdist.script.launch import new_run_id, tagged_processes
from simdist.script.ranks import Block, RankConn, Timeline, ZeroCost
from simdist.script.rendezvous import FULL_MESH, INIT_WAIT, REFUSED, RendezvousMixin
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

    def arrive(self, rank: int, at: float = 0.0, to: float | None = None, clock: float = 0.0) -> None:
        """`at`: when it entered init (wall time: a process's first init is judged on it)."""
        conn = RankConn(None, rank=rank, clock=clock)  # type: ignore[arg-type]
        self.gens[0].by_rank[rank] = conn
        self._arrive(conn, self.gens[0], {"req": rank + 1, "at": at, "to": to})


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
    assert rv._unjoinable(rv.gens[0]) and rv._init_expire()
    assert list(rv.answers) == [0] and rv.answers[0]["raise"][1].endswith("//cpu//0/1")
    assert rv.gens[0].by_rank[2].blocked() and not rv._init_expire()  # the other waits for good: a hang


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


def _compare(zygote, args: list[str], nproc: int = 3, script=INIT):
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
    timeout) when the last rank exited or raised before init, or comes 2 s late (it then fails
    to connect to the peers that left: "Connection refused"); both sides agree rank by rank."""
    sim, real = _compare(script_zygote, [mode, "0.5"])
    c = compare_reports(sim, real)
    # the late rank's connect: refused, or a connect timeout on real Gloo (the ports decide)
    assert c.agree or [r.rank for r in rendezvous_races(sim, real, c)] == [2], \
        format_comparison(c)
    at = line_of(INIT, "dist.init_process_group(")
    for rep in (sim, real):
        assert [(r.status, r.error.type, r.error.category) for r in rep.ranks[:2]] == \
            [("error", "DistStoreError", "timeout")] * 2, rep.source
        assert [r.location.line for r in rep.ranks[:2]] == [at, at]
        assert "wait timeout after 500ms, keys: " in rep.ranks[0].error.message
        assert rep.ranks[2].error.message.startswith(FULL_MESH) if mode == "sleeps2" else \
            rep.ranks[2].error.type == "ScriptError"
        if mode != "sleeps2":  # where the rank that never came left, on both sides
            assert rep.ranks[2].location.line == line_of(INIT, "sys.exit(0)" if mode == "exits" else "raise ")
    assert [r.time for r in sim.ranks[:2]] == [0.5, 0.5]


@pytest.mark.real
def test_an_inits_timeout_runs_out_on_time_while_the_late_rank_computes(script_zygote):
    """Rank 1 computes 1.5 s (busy: no message reaches the coordinator meanwhile) before its
    init; rank 0's init with `timeout=0.3` raises the store's error 0.3 s after it entered, as
    real Gloo's store wait does, not once rank 1 comes (the simulator's wait used to end only at
    that arrival: the rank's own printed line said so); rank 1 then fails to connect."""
    sim, real = _compare(script_zygote, ["computes1.5", "0.3"], nproc=2)
    c = compare_reports(sim, real)
    assert c.agree or [r.rank for r in rendezvous_races(sim, real, c)] == [1], \
        format_comparison(c)
    for rep in (sim, real):
        assert (rep.ranks[0].error.type, rep.ranks[0].error.category) == ("DistStoreError", "timeout"), rep.source
        assert rep.ranks[0].output == ["0 raised before the last rank came"], rep.source
        assert rep.ranks[1].error.message.startswith(FULL_MESH), rep.source
    assert sim.ranks[0].time == 0.3


@pytest.mark.real
@pytest.mark.parametrize("mode", ["exits", "subexits"])
def test_a_rank_that_exits_before_init_leaves_the_others_waiting_there(script_zygote, mode):
    """No timeout (torch's 30 min default, not modelled): the simulator proves the hang at
    once, each waiting rank at its init line, and says which rank never came. (Real Gloo waits
    for its store's timeout here: not run.) `subexits`: the rank first runs a child
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
