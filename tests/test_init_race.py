"""`simdist.init_race`: the group-connection race as it shows in init. `tests/scripts/
leaves_after_init.py` (3 ranks): rank 0 returns right after init, ranks 1 and 2 go on to a
barrier and lose it there (the simulator), or one of them is still connecting init's full
mesh when rank 0's process ends and fails there, and torchrun's agent ends the other (real
Gloo, 2 of 30 beside 4 CPU burners). The simulated report notes ranks 1 and 2, and only a
real run whose differences are those ends on those ranks is the race.

The saved runs (tests/data/races/init_leaves_*.json): `python bench/race_tally.py
tests/scripts/leaves_after_init.py --nproc 3 --n 30 --keep DIR` beside 4 CPU burners: the
simulated run, and the two real runs that differed (rank 1 the racer, then rank 2)."""

from __future__ import annotations

import copy
import json

import pytest

from simdist.compare import compare_reports
from simdist.init_race import INIT_RACE_S, InitRace, init_race_notes, init_races, noted_init_races
from simdist.races import named_races
from simdist.report import RankError, RankResult, Report, TraceEntry
from simdist.vocab import AGENT_TERMINATED
from tests.conftest import ROOT
from tests.test_script_examples import _run, differences_but_noted_races

RACES = ROOT / "tests" / "data" / "races"


def _saved(name: str) -> Report:
    return Report.from_dict(json.loads((RACES / f"init_leaves_{name}.json").read_text()))


def _races(sim: Report, real: Report) -> list:
    return named_races(sim, real, compare_reports(sim, real))


@pytest.mark.parametrize(("real", "racer", "other"), [("real_rank1", 1, 2), ("real_rank2", 2, 1)])
def test_a_rank_failing_in_init_with_the_leavers_closure_and_its_partner_sigtermed_is_the_race(real, racer, other):
    sim, r = _saved("sim"), _saved(real)
    assert noted_init_races(sim) == {1: 0, 2: 0}
    assert not compare_reports(sim, r).agree
    races = _races(sim, r)
    assert sorted(races, key=lambda x: x.rank) == sorted([InitRace(racer, 0, "connect"), InitRace(other, 0, "agent")],
                                                         key=lambda x: x.rank)
    assert differences_but_noted_races(sim, r) == []
    assert races[0].describe().startswith(f"rank {races[0].rank}: init connect race, not a model difference")


def test_without_the_note_or_with_anything_else_it_is_a_difference():
    sim, real = _saved("sim"), _saved("real_rank1")
    unnoted = copy.deepcopy(sim)
    unnoted.notes = [n for n in sim.notes if "init connect race" not in n]
    assert init_races(unnoted, real, compare_reports(unnoted, real)) == []
    assert differences_but_noted_races(unnoted, real) != []
    printed = copy.deepcopy(real)  # the partner printed a line the simulator did not
    printed.ranks[2].output = ["[2] done"]
    assert _races(sim, printed) == []
    timed_out = copy.deepcopy(real)  # the racer timed out in init: not this race's end
    timed_out.ranks[1].error = RankError("RuntimeError", "Timed out waiting 1800000ms", "timeout")
    assert _races(sim, timed_out) == []
    for refused in ("Connection refused", "Broken pipe"):  # a connect failure that is no peer's closure
        other = copy.deepcopy(real)  # (a listener gone or never there: no rank that connected its side makes it)
        other.ranks[1].error = RankError("RuntimeError", f"Gloo connectFullMesh failed with [pair.cc:144] {refused}",
                                         "peer_lost")
        assert _races(sim, other) == [] and differences_but_noted_races(sim, other) != [], refused
    partner_timed_out = copy.deepcopy(real)  # the partner neither lost a peer nor was ended by the agent
    partner_timed_out.ranks[2].exit = "raised RuntimeError"  # (`ConnectRace` names it: it waited for the racer)
    partner_timed_out.ranks[2].error = RankError("RuntimeError", "Timed out waiting 1800000ms", "timeout")
    assert init_races(sim, partner_timed_out, compare_reports(sim, partner_timed_out)) == []
    later = copy.deepcopy(real)  # the racer failed connecting after an operation: a later group's, not init's
    later.ranks[1].trace = copy.deepcopy(sim.ranks[1].trace)
    assert _races(sim, later) == []
    observed = copy.deepcopy(real)  # a value the simulator did not observe: no field of a stopped rank
    observed.ranks[1].observed = {"loss": 1.0}
    assert _races(sim, observed) == []
    no_racer = copy.deepcopy(real)  # both ended by the agent: no rank failed connecting
    no_racer.ranks[1] = copy.deepcopy(no_racer.ranks[2])
    no_racer.ranks[1].rank = 1
    assert init_races(sim, no_racer, compare_reports(sim, no_racer)) == []


def _op(done: bool, t_done: float | None = None) -> TraceEntry:
    return TraceEntry(1, "barrier", 0, "float32", "WORLD", 3, "user.x.py:9", completed=done, t_done=t_done)


def test_only_ranks_that_had_completed_nothing_when_an_early_leaver_ended_are_noted():
    """Rank 0 returns at 0.2 s having completed nothing: rank 1 (its barrier lost) is noted,
    rank 2 (a barrier done at 0.1 s: it had left init) is not. No note when the leaver ended
    past `INIT_RACE_S`, completed an operation, was ended by the agent, or the world had two
    generations."""
    lost = RankError("RuntimeError", "Connection closed by peer (rank 0 has exited)", "peer_lost")

    def ranks(t0: float = 0.2, ops0: list[TraceEntry] | None = None, exit0: str = "returned normally") -> list:
        return [RankResult(0, "completed", trace=ops0 or [], time=t0, exit=exit0),
                RankResult(1, "error", error=lost, trace=[_op(False)], time=t0, exit="raised RuntimeError"),
                RankResult(2, "error", error=lost, trace=[_op(True, 0.1), _op(False)], time=t0, exit="raised RuntimeError")]

    assert [n.split(":")[0] for n in init_race_notes(ranks(), 1)] == ["rank 1"]
    assert init_race_notes(ranks(t0=INIT_RACE_S + 0.01), 1) == []
    assert init_race_notes(ranks(ops0=[_op(True, 0.05)]), 1) == []
    assert init_race_notes(ranks(exit0=f"{AGENT_TERMINATED} after rank 1 failed"), 1) == []
    assert init_race_notes(ranks(), 2) == []
    later = ranks()  # rank 2's barrier done after rank 0 ended: it may still have been in init then
    later[2].trace = [_op(True, 0.3), _op(False)]
    assert [n.split(":")[0] for n in init_race_notes(later, 1)] == ["rank 1", "rank 2"]


@pytest.mark.real
def test_leaves_after_init_notes_the_race_and_real_gloo_agrees_up_to_it(script_zygote):
    entry = {"script": "../tests/scripts/leaves_after_init.py", "nproc": 3}
    sim, real = _run(entry, "sim", script_zygote), _run(entry, "gloo", script_zygote)
    assert [r.status for r in sim.ranks] == ["completed", "error", "error"]
    assert noted_init_races(sim) == {1: 0, 2: 0}, sim.notes
    assert differences_but_noted_races(sim, real) == []


def test_a_connect_race_without_a_sigtermed_partner_is_accepted_only_where_noted():
    """Rank 2 failed in init with rank 0's closure and rank 1 lost rank 0 in its barrier as
    simulated: `ConnectRace` names it in `compare` (noted or not); a test accepts it only when
    the simulated report noted the racer (`differences_but_noted_races`)."""
    sim, real = _saved("sim"), _saved("real_connect")
    assert [r.kind for r in _races(sim, real)] == ["connect"] and _races(sim, real)[0].rank == 2
    assert differences_but_noted_races(sim, real) == []
    unnoted = copy.deepcopy(sim)
    unnoted.notes = [n for n in sim.notes if "init connect race" not in n]
    assert differences_but_noted_races(unnoted, real) != []
