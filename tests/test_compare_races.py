"""`simdist compare` names the races of the real run (`simdist.races`) wherever it shows a
comparison: the text says the runs agree up to a race and gives each race's line, `--json`
carries them (`verdict`, `races`), and the exit code is 4, apart from agreement (0) and a
model difference (1). A real race cannot be forced, so the comparison's two runs are a saved
real run that showed one and the simulated run beside it (tests/data/races/), handed to the
command through the API layer it calls (`simdist.script.api.compare_script`)."""

from __future__ import annotations

import copy
import dataclasses
import json
import types

import pytest

from simdist.agent_race import AgentRace, noted_agent_races, tied_timeout
from simdist.cli.console import ExitCode, worst
from simdist.cli.reports import Compared
from simdist.closure_races import TIE_RACE_S, ResetRace, noted_reset_races, noted_tie_races, tie_race_notes
from simdist.compare import AGREE_UP_TO_A_RACE
from simdist.races import TeardownRace
from simdist.report import RankError, RankResult, Report, TraceEntry
from simdist.script.build import _agent_on_clock
from simdist.script.deadlines import Expiry, message
from simdist.script.workdir import SetAside
from tests.conftest import ROOT

RACES = ROOT / "tests" / "data" / "races"
SCRIPT = ROOT / "tests" / "scripts" / "pg_timeouts.py"


def _reports() -> tuple[Report, Report]:
    return tuple(Report.from_dict(json.loads((RACES / f"monitored_sub_{n}.json").read_text()))
                 for n in ("sim", "real_rank2_hangs"))


def _compare(monkeypatch, sim: Report, real: Report):
    """`simdist compare tests/scripts/pg_timeouts.py ... -- --case monitored_sub`, its two runs `sim` and `real`."""
    from typer.testing import CliRunner

    import simdist.script.api as api
    from simdist.cli import app

    def both(path, args, **kw):
        assert (str(path), list(args)) == (str(SCRIPT), ["--case", "monitored_sub"])
        return api.ScriptComparison(api.ScriptRun(sim), api.ScriptRun(real), SetAside())

    monkeypatch.setattr(api, "compare_script", both)
    return CliRunner().invoke(app, ["compare", str(SCRIPT), "--nproc-per-node", "3",
                                    "--", "--case", "monitored_sub"])


def test_compare_says_the_runs_agree_up_to_a_race_and_exits_4(monkeypatch):
    res = _compare(monkeypatch, *_reports())
    assert res.exit_code == ExitCode.RACE == 4, res.output
    lines = res.output.splitlines()
    assert lines[0].startswith(f"pg_timeouts.py: sim and real {AGREE_UP_TO_A_RACE} (outcome sim error, real error)")
    assert lines[1].startswith("  race: rank 1: group-connection race, not a model difference: ")
    assert "ranks [2] waited for it outside any operation" in lines[1]
    assert "    status: sim completed, real hang" in lines  # what the race changed is still shown
    assert "DIFFER" not in res.output


def test_compare_json_carries_the_races():
    """`--json`'s head is `Compared.jsonable` (written as it is, with the workdir and both reports:
    typer's test runner has no stderr file for the script's own output to go to, so not run here)."""
    doc = json.loads(json.dumps(Compared.of(*_reports()).jsonable(), default=str))
    assert (doc["agree"], doc["verdict"]) == (False, "race")
    [race] = doc["races"]
    assert {k: race[k] for k in ("kind", "rank", "lost", "waited")} == {"kind": "connect", "rank": 1, "lost": [],
                                                                          "waited": [2]}
    assert race["describe"].startswith("rank 1: group-connection race")


def test_a_difference_beside_the_race_is_a_difference_exit_1(monkeypatch):
    sim, real = _reports()
    real.ranks[0].output = ["rank 0: a line the simulator did not print"]
    assert (Compared.of(sim, real).verdict, Compared.of(sim, real).races) == ("differ", [])
    res = _compare(monkeypatch, sim, real)
    assert res.exit_code == 1 and "sim and real DIFFER" in res.output and "race:" not in res.output
    res = _compare(monkeypatch, sim, sim)
    assert res.exit_code == 0 and res.output.startswith("pg_timeouts.py: sim and real agree (outcome error)")


@pytest.mark.parametrize(("codes", "code"), [([0, 4], 4), ([4, 1], 1), ([4, 2, 0], 2), ([], 0), ([141, 130], 141)])
def test_a_race_is_worse_than_agreement_and_better_than_a_failed_check(codes, code):
    """Over several files a command exits with the worst code; a race ranks between 0 and 1."""
    assert worst(codes) == code


@pytest.mark.parametrize("call", ["init_process_group", "new_group"])
def test_a_rendezvous_race_names_the_call_its_peers_timed_out_in(call):
    """A late member's refused connect (the simulator) against real Gloo's connect timeout is
    the rendezvous race at init and at new_group alike; its line names the call, which the
    simulator's message says (`rendezvous.REFUSED` ... "(rank 0 timed out in <call>)")."""
    from simdist.races import RendezvousRace, rendezvous_race
    from simdist.report import RankError, RankResult
    from simdist.script.rendezvous import REFUSED
    from simdist.vocab import FULL_MESH

    def report(message: str) -> Report:
        rank = RankResult(0, "error", error=RankError("RuntimeError", message, "other"))
        return Report("late.py", "sim", "error", [rank], world_size=1)

    sim = report(f"{REFUSED} (rank 1 timed out in {call})")
    real = report(f"{FULL_MESH} [gloo/transport/tcp/pair.cc] Connect timeout [none]")
    race = rendezvous_race(sim, real, 0)
    assert race == RendezvousRace(0, call) and f"it came to {call} after its peers' {call} timed out" in race.describe()
    assert rendezvous_race(sim, sim, 0) is None  # refused on both sides: no race, the same outcome


def _teardown(shape: str) -> tuple[Report, Report]:
    """`python bench/race_tally.py tests/scripts/rooted_root_exits.py --nproc N --keep DIR -- scatter
    {shape}`: its simulated run and a real one in which rank 1 lost the root (2 ranks for `async`,
    3 for `gone`)."""
    return tuple(Report.from_dict(json.loads((RACES / f"teardown_scatter_{shape}_{n}.json").read_text()))
                 for n in ("sim", "real"))


@pytest.mark.parametrize("shape", ["async", "gone"])
def test_a_rank_that_lost_a_root_which_posted_and_left_is_a_teardown_race(shape):
    """The root of a scatter posted it and ended (`async`: it exited without waiting on it;
    `gone`: it failed on a leaf that had left, right after posting to rank 1). The simulator
    completes rank 1's scatter, as real Gloo mostly does; in these real runs the root's sockets
    closed before rank 1's receive notice had its block written: rank 1 lost it. A race of
    the root's teardown (`simdist.races`: both outcomes measured), exit code 4, not agreement."""
    sim, real = _teardown(shape)
    assert sim.ranks[1].status == "completed" and real.ranks[1].error.category == "peer_lost"
    got = Compared.of(sim, real)
    assert (got.verdict, got.code) == ("race", ExitCode.RACE)
    assert got.races == [TeardownRace(1, "scatter", 2, "WORLD", (0,))]
    assert got.races[0].describe().startswith("rank 1: teardown race, not a model difference: ranks [0] posted "
                                              "#2 scatter on WORLD and ended right after")


def test_a_teardown_race_needs_the_leaver_to_end_with_the_collective_and_nothing_else_to_differ():
    """Each condition of the race, broken one at a time on the saved runs, leaves a difference:
    the root went on to another collective (on both sides: the scatter's messages were not its
    last, so the loss is not its teardown's), rank 1 timed out instead of losing a peer, or printed a
    line the simulator has it print nowhere; the root's scatter ended on real Gloo before it left
    (neither posted-and-gone nor failed in it: its messages had moved), or the root ended long
    after posting it (10 s: rank 1's part reached it while it was up, so the loss is no teardown's);
    the operations are point-to-point (their counts pair no two ranks' calls: not one collective)."""
    def broken(change) -> str:
        sim, real = _teardown("async")
        change(sim, real)
        return Compared.of(sim, real).verdict

    def root_goes_on(sim: Report, real: Report) -> None:  # on both sides: rank 0 itself agrees
        for report in (sim, real):
            report.ranks[0].trace.append(dataclasses.replace(report.ranks[0].trace[-1], seq=3, op="barrier", numel=0))

    def times_out(sim: Report, real: Report) -> None:
        real.ranks[1].error = dataclasses.replace(real.ranks[1].error, category="timeout")

    def prints_more(sim: Report, real: Report) -> None:
        real.ranks[1].output = ["[1] a line of its own"]

    def root_waited(sim: Report, real: Report) -> None:  # its scatter ended before it left: its part had moved
        real.ranks[0].trace[-1] = dataclasses.replace(real.ranks[0].trace[-1], completed=True)

    def root_lingered(sim: Report, real: Report) -> None:  # it computed 10 s after posting: rank 1's part met it up
        sim.ranks[0].time = sim.ranks[0].trace[-1].t_issue + 10.0

    def point_to_point(sim: Report, real: Report) -> None:  # two receives with the same p2p count: no collective
        for report in (sim, real):
            for r in report.ranks:
                r.trace[-1] = dataclasses.replace(r.trace[-1], op="recv", peer=1 - r.rank, seq=1)

    assert broken(lambda sim, real: None) == "race"
    assert [broken(f) for f in (root_goes_on, times_out, prints_more, root_waited, root_lingered,
                                point_to_point)] == ["differ"] * 6


def test_a_root_that_failed_in_its_collective_long_after_posting_it_makes_no_teardown_race():
    """`gone`, but the leaf that made the root fail ended 10 s after the root posted (the
    simulated clocks): the root was up all that while, rank 1's part reached it, so real Gloo
    completes rank 1's scatter; a loss there is a difference. The root's own clock stops at
    its last post: it ended when the leaf's exit failed it (`simdist.race_walk.failed_at`)."""
    sim, real = _teardown("gone")
    assert Compared.of(sim, real).verdict == "race"
    sim.ranks[2].time = sim.ranks[0].trace[-1].t_issue + 10.0
    assert Compared.of(sim, real).verdict == "differ"


def test_a_rank_sigtermed_before_it_lost_another_failed_rank_is_an_agent_race():
    """examples/monitored_barrier_straggler.py (3 ranks; `python bench/race_tally.py
    examples/monitored_barrier_straggler.py --nproc 3 --keep DIR`): rank 2 raises, rank 0's
    monitored_barrier fails on its closure, and rank 1, waiting for rank 0's answer, loses rank 0
    in turn. On real Gloo that loss comes only once rank 0 has torn down, while the agent's
    SIGTERM comes a poll after rank 2's end: either first (real torchrun: rank 1 SIGTERMed in 5
    of 6 runs; simdist's real side: in 15 of 40 under load). The simulator keeps rank 1's own
    end and notes the race (`race_notes.lost_after_teardown`); a real run whose SIGTERM came first
    is that race, exit code 4, not a difference."""
    sim, real = (Report.from_dict(json.loads((RACES / f"agent_chain_monitored_{n}.json").read_text()))
                 for n in ("sim", "real"))
    assert [n.split(" inside")[0] for n in sim.notes if "agent race" in n] == [
        "rank 1: agent race: its own end came 0.00 s after rank 2's failure on the simulated clock, and on real "
        "Gloo only once rank 0, which failed too, had torn down,"]
    assert (sim.ranks[1].error.category, real.ranks[1].error.category) == ("peer_lost", "killed")
    got = Compared.of(sim, real)
    assert (got.verdict, got.code) == ("race", ExitCode.RACE)
    assert got.races == [AgentRace(1, 2, 0.0, False)]


def test_a_rank_sigtermed_before_it_raised_its_loss_of_the_failed_rank_is_an_agent_race():
    """tests/scripts/unsorted_group.py sizes (3 ranks; `python bench/race_tally.py
    tests/scripts/unsorted_group.py --nproc 3 --keep DIR -- sizes`): rank 2 aborts, ranks 0 and
    1 lose it in the ring. On real Gloo each fails only once its own threads see the closure,
    and the agent's poll after rank 2's end may come first (simdist's real side, beside two CPU
    hogs: 5 of 30 runs, here both ranks). The simulator keeps their loss and notes the race on
    each (`build._agent_on_clock`, a loss below the band); such a run is that race, exit code 4.
    Anything else on those ranks stays a difference."""
    sim, real = (Report.from_dict(json.loads((RACES / f"loss_reaction_sizes_{n}.json").read_text()))
                 for n in ("sim", "real"))
    assert {r: gap for r, (_, gap, _) in noted_agent_races(sim).items()} == {0: 0.0, 1: 0.0}
    assert [r.error.category for r in real.ranks] == ["killed", "killed", "gloo_abort"]
    got = Compared.of(sim, real)
    assert (got.verdict, got.code) == ("race", ExitCode.RACE)
    assert got.races == [AgentRace(0, 2, 0.0, False), AgentRace(1, 2, 0.0, False)]
    real.ranks[0].output = ["rank 0: a line the simulator never printed"]
    assert Compared.of(sim, real).verdict == "differ"


def _expiry(rank: int, deadline: float, op: str = "all_reduce", peer: int | None = None, group: str = "WORLD") -> Expiry:
    entry = TraceEntry(1, op, 4, "float32", group, 3, "user.x.py:9", peer=peer)
    return Expiry(rank, entry, [], deadline, 3.0, message(op, 3.0))


def test_tied_timeouts_within_the_closure_band_are_noted_both_ways_and_no_others():
    """`closure_races.tie_race_notes`: ranks whose tied timeouts are within `TIE_RACE_S` of
    another's in the same group are noted, the earlier one too (under load real Gloo's rank 1,
    the earliest on the simulated clocks, once lost rank 0's closure); a timeout farther off,
    in another group, or a send's or receive's against a rank that is not its peer is not."""
    def noted(expired: list[Expiry]) -> dict[int, tuple[int, float]]:
        sim = Report("x.py", "sim", "error", [])
        sim.notes = tie_race_notes(expired)
        return {r: (other, round(gap, 5)) for r, (other, gap) in noted_tie_races(sim).items()}

    assert noted([_expiry(1, 3.00009), _expiry(0, 3.00018), _expiry(2, 3.00018)]) == {
        1: (0, 0.00009), 0: (2, 0.0), 2: (0, 0.0)}
    assert noted([_expiry(1, 3.0), _expiry(0, 3.0 + TIE_RACE_S + 0.001)]) == {}  # past the band: the model's TIE_S
    assert noted([_expiry(1, 3.0), _expiry(0, 3.001, group="pg1")]) == {}
    assert noted([_expiry(0, 3.0, "recv", peer=1), _expiry(2, 3.001, "recv", peer=1)]) == {}
    assert noted([_expiry(0, 3.0, "recv", peer=1), _expiry(1, 3.001, "send", peer=0)]) == {0: (1, 0.001), 1: (0, 0.001)}


def _saved(name: str) -> tuple[Report, Report]:
    return tuple(Report.from_dict(json.loads((RACES / f"{name}_{n}.json").read_text())) for n in ("sim", "real"))


def test_a_rank_that_met_a_tied_peers_closure_is_a_tie_race_only_where_noted():
    """tests/scripts/rank_failures.py --case mismatch (3 ranks; `python bench/race_tally.py
    tests/scripts/rank_failures.py --nproc 3 --keep DIR -- --case mismatch --pg-timeout 3`):
    the three timeouts are 0.09 ms apart on the simulated clocks; beside two CPU burners (load
    14-19) real rank 0 met rank 1's timeout's closure ("Connection closed by peer") in 4 runs of
    20, rank 1 a closure in 1.
    Named a tie race on a noted rank; not on a rank the report did not note, nor with anything
    else differing."""
    sim, real = _saved("tie_mismatch")
    assert set(noted_tie_races(sim)) == {0, 1, 2}
    assert [r.error.category for r in real.ranks] == ["peer_lost", "timeout", "timeout"]
    got = Compared.of(sim, real)
    assert (got.verdict, got.code) == ("race", ExitCode.RACE)
    assert [(r.kind, r.rank) for r in got.races] == [("tie", 0)]
    assert "tie race, not a model difference" in got.races[0].describe()
    unnoted = dataclasses.replace(sim, notes=[n for n in sim.notes if not n.startswith("rank 0: tie race")])
    assert Compared.of(unnoted, real).verdict == "differ"
    # the other order (1 run of 20): rank 1, the earliest on the simulated clocks, met a closure
    other = Report.from_dict(json.loads((RACES / "tie_mismatch_real_rank1.json").read_text()))
    assert [r.error.category for r in other.ranks] == ["timeout", "peer_lost", "timeout"]
    assert [(r.kind, r.rank) for r in Compared.of(sim, other).races] == [("tie", 1)]
    real.ranks[0].output = real.ranks[0].output[:1]
    assert Compared.of(sim, real).verdict == "differ"


def test_a_rank_whose_block_the_aborts_reset_overtook_is_a_reset_race_only_where_noted():
    """tests/scripts/alltoallv_split_sizes.py (2 ranks; `python bench/race_tally.py
    tests/scripts/alltoallv_split_sizes.py --nproc 2 --keep DIR`): rank 1 aborts on rank 0's
    longer block; in the simulator rank 0 read rank 1's block and fails at its next all_reduce,
    on a loaded host real rank 0 lost the block to the abort's reset and failed in the
    alltoallv ("Read error"). Named a reset race on the noted rank; not where unnoted, nor
    where the rank failed otherwise than by losing its peer."""
    sim, real = _saved("reset_alltoallv")
    assert noted_reset_races(sim) == {0: (1, 2, "all_to_all", "WORLD")}
    assert real.ranks[0].output == [] and real.ranks[1].status == "aborted"
    got = Compared.of(sim, real)
    assert (got.verdict, got.code) == ("race", ExitCode.RACE)
    assert got.races == [ResetRace(0, 1, 2, "all_to_all")]
    unnoted = dataclasses.replace(sim, notes=[n for n in sim.notes if "reset race" not in n])
    assert Compared.of(unnoted, real).verdict == "differ"
    real.ranks[0].error = dataclasses.replace(real.ranks[0].error, category="timeout")
    assert Compared.of(sim, real).verdict == "differ"


def _sim_wrong(sim: Report, rank: int, **change) -> Report:
    """`sim` with rank `rank`'s result changed as a model bug would change it."""
    ranks = list(sim.ranks)
    ranks[rank] = dataclasses.replace(ranks[rank], **change)
    return dataclasses.replace(sim, ranks=ranks)


def test_a_noted_rank_whose_simulated_outcome_is_wrong_is_a_difference_not_a_race():
    """The notes excuse only the difference the race makes (a noted rank's timeout against a
    real lost peer; a noted reader's failure in the aborted collective), never the simulator's
    own mistakes on those ranks: a wrong error category or a wrong printed value on a noted
    rank, in the saved runs of both races, is a difference. (What the simulator has a reset
    race's reader do after the block it read, the real run did not reach: the sweep test pins
    that side, tests/test_script_sweep_regressions.py.)"""
    sim, real = _saved("tie_mismatch")
    assert Compared.of(sim, real).verdict == "race"
    for rank in (0, 2):  # 0 met the closure on real Gloo, 2 timed out as simulated: both noted
        err = sim.ranks[rank].error
        # (rank 0 simulated as peer_lost is what its real run showed: agreement, not a case here)
        categories = ["other"] + (["peer_lost"] if rank == 2 else [])
        wrong = [_sim_wrong(sim, rank, error=dataclasses.replace(err, category=c)) for c in categories]
        wrong.append(_sim_wrong(sim, rank, output=[o.replace("4.0, 3.0", "4.0, 3.5") for o in sim.ranks[rank].output]))
        assert wrong[-1].ranks[rank].output != sim.ranks[rank].output
        for bad in wrong:
            got = Compared.of(bad, real)
            assert (got.verdict, got.races) == ("differ", []), (rank, bad.ranks[rank])
    sim, real = _saved("reset_alltoallv")
    assert Compared.of(sim, real).verdict == "race"
    err = sim.ranks[1].error
    for bad in (_sim_wrong(sim, 1, error=dataclasses.replace(err, category="timeout"), status="error"),
                _sim_wrong(sim, 1, status="completed", error=None)):
        assert (Compared.of(bad, real).verdict, Compared.of(bad, real).races) == ("differ", [])


def test_a_rank_sigtermed_before_its_own_tied_timeout_fired_is_an_agent_race_only_there():
    """tests/scripts/pg_timeouts.py --case never (3 ranks; `python bench/race_tally.py
    tests/scripts/pg_timeouts.py --nproc 3 --keep DIR -- --case never`): ranks 0 and 1 time out
    together in their all_reduce at 2 s on the simulated clocks, and rank 2, in a subgroup
    all_reduce with rank 1, loses it. On real Gloo each deadline counts from the rank's own entry
    into its wait; under load rank 1's fired after the agent's SIGTERM that followed rank 0's
    failure (simdist's real side beside CPU burners, load 11-16: 3 of 40 runs). The simulator
    keeps rank 1's timeout and notes the agent race on it (`agent_race.tied_timeout`), not on
    rank 0, the first failure; such a run is that race, exit code 4. Unnoted, or with a line
    the simulator never printed, it stays a difference."""
    sim, real = _saved("agent_tie_never")
    assert noted_agent_races(sim) == {1: (False, 0.0, 0), 2: (False, 0.0, 0)}
    assert "its own Gloo timeout tied with rank 0's" in next(n for n in sim.notes if n.startswith("rank 1: agent race"))
    assert [r.error.category for r in real.ranks] == ["timeout", "killed", "killed"]
    got = Compared.of(sim, real)
    assert (got.verdict, got.code) == ("race", ExitCode.RACE)
    assert got.races == [AgentRace(1, 0, 0.0, False), AgentRace(2, 0, 0.0, False)]
    unnoted = dataclasses.replace(sim, notes=[n for n in sim.notes if not n.startswith("rank 1: agent race")])
    assert Compared.of(unnoted, real).verdict == "differ"
    real.ranks[1].output = ["rank 1: a line the simulator never printed"]
    assert Compared.of(sim, real).verdict == "differ"


def test_only_a_timeout_tied_with_a_timeout_first_failure_races_the_agent_so():
    """`agent_race.tied_timeout`: a rank's own timeout within `TIE_RACE_S` of the first
    failure, itself a timeout; not farther off, not a lost peer, not after a failure that is no
    timeout (whose instant no deadline stretches)."""
    def rank(r: int, category: str) -> RankResult:
        return RankResult(rank=r, status="error", error=RankError("RuntimeError", "x", category))

    first, tied = rank(0, "timeout"), rank(1, "timeout")
    assert tied_timeout(first, tied, 0.0) and tied_timeout(first, tied, TIE_RACE_S)
    assert not tied_timeout(first, tied, TIE_RACE_S + 0.001)
    assert not tied_timeout(first, rank(1, "peer_lost"), 0.0)
    assert not tied_timeout(rank(0, "other"), tied, 0.0)


def test_a_timeout_tied_across_groups_excuses_no_wrong_timeout():
    """`build._agent_on_clock` notes a tied timeout's agent race only for a rank whose timed-out
    wait is in the first failure's group, the measured shape (pg_timeouts.py --case never: ranks
    0 and 1 in WORLD's all_reduce). A simulator that wrongly gave rank 2's subgroup (torch's
    default timeout: on real Gloo it waits until the agent's SIGTERM) the world's 2 s would time
    it out tied with rank 0; noted, every real run's SIGTERM there would read as a race, never
    as the model error it is. (The coordinator: only what the agent reads; rank 0 tore down.)"""
    sim, real = _saved("agent_tie_never")
    wrong = copy.deepcopy(sim.ranks)
    wrong[2].error, wrong[2].output = RankError("RuntimeError", message("recv", 2.0), "timeout"), ["rank 2: timed out"]

    def notes(groups: dict[int, str]) -> list[str]:
        expired = [Expiry(r.rank, dataclasses.replace(r.trace[-1], group=groups[r.rank]), [], 2.0, 2.0, "")
                   for r in wrong]
        coord = types.SimpleNamespace(gens=[], no_init={0: {"how": "exception"}}, expired=expired)
        agent = _agent_on_clock(coord, copy.deepcopy(wrong), [1, 1, 1])  # type: ignore[arg-type]
        return [n for n in sim.notes if ": agent race:" not in n] + agent

    across = dataclasses.replace(sim, ranks=wrong, notes=notes({0: "WORLD", 1: "WORLD", 2: "pg1"}))
    assert sorted(noted_agent_races(across)) == [1]
    assert [r.error.category for r in real.ranks] == ["timeout", "killed", "killed"]
    assert Compared.of(across, real).verdict == "differ"
    within = dataclasses.replace(across, notes=notes({0: "WORLD", 1: "WORLD", 2: "WORLD"}))  # one group: the race
    assert sorted(noted_agent_races(within)) == [1, 2]
    assert Compared.of(within, real).verdict == "race"
