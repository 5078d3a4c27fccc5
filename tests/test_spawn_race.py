"""`simdist.spawn_race`: mp.spawn's SIGTERM against a failed child's Gloo closure
(`examples/spawn_init_methods.py --fail 1`: worker 1 raises while worker 0 waits in DDP's
all_reduce #8). The simulated report notes rank 0, and only rank 0; a real run whose rank 0
ended the other way is that race, either way round, and anything else stays a difference.

The saved runs (tests/data/races/spawn_fail1_*.json): `python bench/race_tally.py
examples/spawn_init_methods.py --n 20 --keep DIR -- --fail 1` (the simulated run and a real run
whose rank 0 lost the peer), and single simulated and real runs kept until rank 0 showed each end."""

from __future__ import annotations

import copy
import json
from types import SimpleNamespace

import pytest

from simdist.compare import compare_reports
from simdist.races import named_races
from simdist.report import RankError, RankResult, Report, TraceEntry
from simdist.script.race_notes import spawned_failures
from simdist.spawn_race import SpawnRace, noted_spawn_races, spawn_race_note, spawn_race_notes, spawn_races
from tests.conftest import EXAMPLES, ROOT
from tests.test_script_examples import _run, differences_but_noted_races

RACES = ROOT / "tests" / "data" / "races"
NOTED = {0: (1, 8, "all_reduce", "WORLD")}  # rank 0's all_reduce #8 waited on rank 1


def _saved(name: str) -> Report:
    return Report.from_dict(json.loads((RACES / f"spawn_fail1_{name}.json").read_text()))


def _races(sim: Report, real: Report) -> list:
    return named_races(sim, real, compare_reports(sim, real))


@pytest.mark.parametrize(("sim", "real", "sim_killed"), [("sim_killed", "real_peer_lost", True),
                                                          ("sim_peer_lost", "real_killed", False)])
def test_rank_0_killed_on_one_side_and_losing_the_peer_on_the_other_is_the_spawn_race(sim, real, sim_killed):
    s, r = _saved(sim), _saved(real)
    assert noted_spawn_races(s) == NOTED
    assert not compare_reports(s, r).agree
    races = _races(s, r)
    assert races == [SpawnRace(0, 1, 8, "all_reduce", sim_killed)]
    assert races[0].describe().startswith("rank 0: spawn race, not a model difference: it waited on rank 1 in #8 all_reduce")


@pytest.mark.parametrize("sim", ["sim_killed", "sim_peer_lost"])
def test_the_same_end_on_both_sides_agrees(sim):
    s = _saved(sim)
    same = {"sim_killed": "real_killed", "sim_peer_lost": "real_peer_lost"}[sim]
    assert compare_reports(s, _saved(same)).agree


def test_a_rank_not_noted_or_another_difference_or_another_operation_is_a_difference():
    """Each condition broken on the saved runs (rank 0 killed in the simulator, losing the peer
    on real Gloo) leaves a difference."""
    sim, real = _saved("sim_killed"), _saved("real_peer_lost")
    unnoted = copy.deepcopy(sim)
    unnoted.notes = [n for n in sim.notes if "spawn race" not in n]
    assert _races(unnoted, real) == []
    more = copy.deepcopy(real)
    more.ranks[0].output = ["a line the simulator did not print"]
    assert _races(sim, more) == []
    other_op = copy.deepcopy(real)  # the peer lost in an earlier operation than the noted one
    other_op.ranks[0].trace = other_op.ranks[0].trace[:-1]
    assert _races(sim, other_op) == []
    timed_out = copy.deepcopy(real)  # another end than the two of the race
    timed_out.ranks[0].error = RankError("RuntimeError", "Timed out waiting 1800000ms", "timeout")
    assert _races(sim, timed_out) == []
    failed_killed = copy.deepcopy(real)  # the failed child did not fail its own way on real Gloo (it differs and
    # no note names it, so the walk leaves it a difference before `spawn_races`' own check of it, a second guard)
    failed_killed.ranks[1].error = RankError("Killed", "the process ended without reporting how", "killed")
    assert spawn_races(sim, failed_killed, compare_reports(sim, failed_killed)) == []
    observed = copy.deepcopy(real)  # a value the simulator did not observe: no field of a stopped rank
    observed.ranks[0].observed = {"loss": 1.0}
    assert _races(sim, observed) == []


def test_a_real_rank_killed_that_did_or_printed_more_than_the_simulated_loser_is_a_difference():
    """The other way round (rank 0 lost the peer in the simulator, killed on real Gloo): a real
    rank 0 that printed a line, or did an operation, the simulated one did not is a difference."""
    sim, real = _saved("sim_peer_lost"), _saved("real_killed")
    printed = copy.deepcopy(real)
    printed.ranks[0].output = ["a line the simulator did not print"]
    assert _races(sim, printed) == []
    further = copy.deepcopy(real)
    further.ranks[0].trace = [*sim.ranks[0].trace, _op(9, True)]
    assert _races(sim, further) == []


def _op(seq: int, done: bool, group: str = "WORLD", op: str = "all_reduce", peer: int | None = None) -> TraceEntry:
    return TraceEntry(seq, op, 1, "float32", group, 3, "user.x.py:9", completed=done, peer=peer)


def test_only_ranks_waiting_on_the_first_spawned_failure_are_noted():
    """Rank 1, an mp.spawn child, fails first; rank 0 killed while its all_reduce with it was
    pending, rank 2 lost it in its recv, rank 3 killed with nothing pending (it computed), rank
    4 killed in a recv from rank 3, rank 5 killed in a collective of a group rank 1 never used,
    rank 6 lost rank 3: only 0 and 2. A failure that was no mp.spawn child's: none."""
    boom = RankError("ValueError", "boom", "other")
    killed = RankError("Killed", "the process ended without reporting how (killed by a signal?)", "killed")
    lost = RankError("RuntimeError", "Connection closed by peer (rank 1 has exited)", "peer_lost")
    lost3 = RankError("RuntimeError", "Connection closed by peer (rank 3 has exited)", "peer_lost")
    ranks = [RankResult(0, "error", error=killed, trace=[_op(1, True), _op(2, False)], time=1.0),
             RankResult(1, "error", error=boom, trace=[_op(1, True)], time=0.9),
             RankResult(2, "error", error=lost, trace=[_op(1, True, "WORLD", "recv", 1)], time=1.0),
             RankResult(3, "error", error=killed, trace=[_op(1, True)], time=1.0),
             RankResult(4, "error", error=killed, trace=[_op(1, True), _op(1, False, "WORLD", "recv", 3)], time=1.0),
             RankResult(5, "error", error=killed, trace=[_op(1, True), _op(1, False, "pg1")], time=1.0),
             RankResult(6, "error", error=lost3, trace=[_op(1, True), _op(2, True)], time=1.0)]
    notes = spawn_race_notes(ranks, frozenset({1}))
    assert notes == [spawn_race_note(0, 1, _op(2, False)), spawn_race_note(2, 1, _op(1, True, "WORLD", "recv", 1))]
    assert spawn_race_notes(ranks, frozenset()) == []
    # rank 2, a spawned child too, lost rank 1 at an earlier last issue: it failed when rank 1 ended, after rank 1
    early = [*ranks[:2], RankResult(2, "error", error=lost, trace=ranks[2].trace, time=0.5), *ranks[3:]]
    assert spawn_race_notes(early, frozenset({1, 2})) == notes


@pytest.mark.real
def test_spawn_init_methods_fail_1_notes_the_race_and_real_gloo_agrees_up_to_it(script_zygote):
    """The simulated side runs the script's own mp.spawn, so it races as real Gloo does: rank 0
    either way, and the note on rank 0 only, whichever; the real run agrees or differs only by
    that race."""
    entry = {"script": "spawn_init_methods.py", "args": ["--fail", "1"]}
    sim, real = _run(entry, "sim", script_zygote), _run(entry, "gloo", script_zygote)
    assert noted_spawn_races(sim) == NOTED, sim.notes
    assert sim.ranks[1].error.category == "other" and sim.ranks[0].error.category in ("killed", "peer_lost")
    assert (EXAMPLES / entry["script"]).is_file()
    assert differences_but_noted_races(sim, real) == []


def _conn(exit: dict | None = None, exit_at: float | None = None, spawn: int | None = None,
          ended_at: float | None = None) -> SimpleNamespace:
    return SimpleNamespace(exit=exit, exit_at=exit_at, spawn=spawn, ended_at=ended_at)


def test_a_spawned_child_killed_by_a_signal_counts_only_when_it_ended_first():
    """`spawned_failures`: a child that told an error counts; a silent one (killed by a signal,
    said at init it is mp.spawn's) counts when it was the first silent one to end and ended
    before every told failure: the later silent ones are mp.spawn's SIGTERM's victims. A silent
    process that is no mp.spawn child (torchrun's rank) never counts."""
    def coord(**by_rank):
        return SimpleNamespace(gens=[SimpleNamespace(by_rank={int(k[1:]): c for k, c in by_rank.items()})])
    told = _conn({"spawn": 2, "error": {"type": "ValueError"}}, exit_at=5.0, spawn=2, ended_at=5.1)
    assert spawned_failures(coord(r1=_conn(spawn=1, ended_at=1.0), r0=_conn(spawn=0, ended_at=1.2))) == {1}
    assert spawned_failures(coord(r1=_conn(spawn=1, ended_at=1.0), r2=told)) == {1, 2}
    assert spawned_failures(coord(r1=_conn(spawn=1, ended_at=6.0), r2=told)) == {2}
    assert spawned_failures(coord(r1=_conn(ended_at=1.0), r0=_conn(ended_at=1.2))) == set()
    assert spawned_failures(coord(r1=_conn(spawn=1))) == set()  # still running at the end: no end seen
