"""`simdist.agent_race`: the race of torchrun's agent is named both ways, only for the ranks
the simulated report notes inside the band of real torchrun's SIGTERM, and only when they did
a beginning of what the other side did (shapes of tests/scripts/agent_sigterm.py 0.5)."""

from __future__ import annotations

from simdist.agent_race import AgentRace, agent_race_note, agent_races
from simdist.compare import compare_reports
from simdist.races import named_races
from simdist.report import RankError, RankResult, Report, TraceEntry
from simdist.script.agent import exit_races_sigterm, sigterm_error, terminated_words

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


def test_a_returned_ranks_exit_races_the_sigterm_where_the_two_bands_meet():
    """A rank whose script returned ends when its process exits (`agent.exit_band`, 0.01-0.2 s
    later): a race wherever that meets real torchrun's SIGTERM (`agent.sigterm_band`), on either
    side of the simulator's instant (failure + 0.13 s)."""
    assert exit_races_sigterm(1.0, 1.0, tore_down=False)  # exit 1.01-1.2 s, SIGTERM 1.02-1.25 s
    assert exit_races_sigterm(0.85, 1.0, tore_down=False)  # returned before the failure: exit until 1.05 s
    assert exit_races_sigterm(1.2, 1.0, tore_down=False)  # the simulator ends it (1.13 s), real may not
    assert not exit_races_sigterm(0.8, 1.0, tore_down=False)  # exited by 1.0 s: completed on both
    assert not exit_races_sigterm(1.3, 1.0, tore_down=False)  # its exit after the latest SIGTERM: ended on both
    assert exit_races_sigterm(3.0, 1.0, tore_down=True)  # after a teardown the SIGTERM comes up to 4 s later


def test_a_real_rank_sigtermed_in_its_exit_is_the_noted_race():
    """examples/grad_accum_no_join.py under CI load: rank 0's script returned (all its lines
    printed, all its operations done) and real torchrun's SIGTERM came in its
    destroy_process_group; the simulator completed it and noted the race ("own end")."""
    lines = ["rank 0: done"]
    sim0 = RankResult(0, "completed", trace=[_op(1)], output=lines, exit="returned normally")
    real0 = RankResult(0, "error", error=sigterm_error(), trace=[_op(1)], output=lines, exit=terminated_words(1))
    sim, real = _reports(sim0, real0, "own end", gap=0.01)
    assert named_races(sim, real, compare_reports(sim, real)) == [AgentRace(0, 1, 0.01, False)]
    sim, real = _reports(sim0, real0, None)  # no note (the bands do not meet): a difference
    assert named_races(sim, real, compare_reports(sim, real)) == []
