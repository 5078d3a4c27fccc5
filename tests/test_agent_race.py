"""`simdist.agent_race`: the race of torchrun's agent is named both ways, only for the ranks
the simulated report notes inside the band of real torchrun's SIGTERM, and only when they did
a beginning of what the other side did (shapes of tests/scripts/agent_sigterm.py 0.5)."""

from __future__ import annotations

import json

from simdist.agent_race import AgentRace, agent_race_note, agent_races
from simdist.compare import compare_reports
from simdist.races import named_races
from simdist.report import RankError, RankResult, Report, TraceEntry
from simdist.script.agent import sigterm_error, terminated_words
from tests.conftest import ROOT

RACES = ROOT / "tests" / "data" / "races"

_BOOM = RankError("RuntimeError", "boom", "other")
_LOST = RankError("RuntimeError", "Connection closed by peer (rank 1 has exited)", "peer_lost")


def _op(seq: int) -> TraceEntry:
    return TraceEntry(seq, "all_reduce", 1, "float32", "WORLD", 2, "user.agent_sigterm.py:18", t_issue=0.5 * (seq - 1))


def _killed(ops: int) -> RankResult:
    return RankResult(0, "error", error=sigterm_error(), trace=[_op(i + 1) for i in range(ops)],
                      exit=terminated_words(1))


def _lost(ops: int) -> RankResult:
    return RankResult(0, "error", error=_LOST, trace=[_op(i + 1) for i in range(ops)], exit="raised RuntimeError")


def _reports(sim0: RankResult, real0: RankResult, step: str | None, gap: float = 0.5) -> tuple[Report, Report]:
    def failed() -> RankResult:
        return RankResult(1, "error", error=_BOOM, trace=[_op(1)], exit="raised RuntimeError")
    notes = [agent_race_note(0, step, gap, 1)] if step else []
    return (Report("x.py", "sim", "error", [sim0, failed()], notes=notes),
            Report("x.py", "real", "error", [real0, failed()]))


def test_the_simulators_agent_first_and_the_real_rank_further_is_the_race():
    sim, real = _reports(_killed(1), _lost(2), "next step")
    races = named_races(sim, real, compare_reports(sim, real))
    assert races == [AgentRace(0, 1, 0.5, True)]
    assert "agent race, not a model difference" in races[0].describe()


def test_real_torchruns_agent_first_and_the_simulated_rank_further_is_the_race():
    sim, real = _reports(_lost(2), _killed(1), "own end", gap=0.08)
    assert named_races(sim, real, compare_reports(sim, real)) == [AgentRace(0, 1, 0.08, False)]


def test_no_note_no_race_and_anything_more_is_a_difference():
    sim, real = _reports(_killed(1), _lost(2), None)  # a step outside the band: the agent's verdict is firm
    assert agent_races(sim, real, compare_reports(sim, real)) == []
    sim, real = _reports(_killed(1), _lost(2), "own end")  # the note says the other way round
    assert agent_races(sim, real, compare_reports(sim, real)) == []
    sim, real = _reports(_killed(2), _lost(1), "next step")  # the ended side did more: not the agent's timing
    assert agent_races(sim, real, compare_reports(sim, real)) == []
    sim, real = _reports(_killed(1), _lost(2), "next step")
    real.ranks[1].output = ["a line the simulator did not print"]  # one more difference: no excuse
    assert agent_races(sim, real, compare_reports(sim, real)) == []


def test_a_rank_that_lost_another_failed_rank_is_an_agent_race_when_torchruns_sigterm_came_first():
    """examples/monitored_barrier_straggler.py (3 ranks; `python bench/race_tally.py
    examples/monitored_barrier_straggler.py --nproc 3 --keep DIR`): rank 2 raises, rank 0's
    monitored_barrier fails on its closure, and rank 1, waiting for rank 0's answer, loses rank 0
    in turn. On real Gloo that loss comes only once rank 0 has torn down, while the agent's
    SIGTERM comes a poll after rank 2's end: either first (real torchrun: rank 1 SIGTERMed in 5
    of 6 runs; simdist's real side: in 15 of 40 under load). The simulator keeps rank 1's own
    end and notes the race (`build._lost_after_teardown`); a real run whose SIGTERM came first
    is that race, named, not a difference."""
    sim, real = (Report.from_dict(json.loads((RACES / f"agent_chain_monitored_{n}.json").read_text()))
                 for n in ("sim", "real"))
    assert [n.split(" inside")[0] for n in sim.notes if "agent race" in n] == [
        "rank 1: agent race: its own end came 0.00 s after rank 2's failure on the simulated clock, and on real "
        "Gloo only once rank 0, which failed too, had torn down,"]
    assert (sim.ranks[1].error.category, real.ranks[1].error.category) == ("peer_lost", "killed")
    assert named_races(sim, real, compare_reports(sim, real)) == [AgentRace(1, 2, 0.0, False)]
