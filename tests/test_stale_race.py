"""`simdist.script.stale_race`: torchrun's stale-address race of a later generation is named in
the simulated report on each rank and group it can hit, and only there, and `compare` never
accepts it (simdist's real side meets each generation's own addresses, `rank.genkeys`)."""

from __future__ import annotations

import copy

from simdist.compare import compare_reports
from simdist.engine.core import Engine
from simdist.races import named_races
from simdist.report import RankError, error_category
from simdist.script import env
from simdist.script.generations import Generation
from simdist.script.ranks import Timeline, ZeroCost
from simdist.script.stale_race import noted_stale_address_races, stale_address_note, stale_address_notes
from tests.test_script_examples import _run


def _gen(index: int, groups: dict[str, list[int]], hosted: bool = False) -> Generation:
    named = {env.group_name(n, n == "0", index): m for n, m in groups.items()}
    g = Generation(index, 3, Engine(3, named, ZeroCost()), Timeline(ZeroCost()))
    g.hosted = hosted
    return g


def test_only_groups_an_earlier_generation_named_alike_at_the_agents_store_are_noted():
    """Generation 1: the world and group "1" of ranks [0, 1]; generation 2: the world, group
    "1" of ranks [0, 2] (its group ranks 0 and 1 had addresses in generation 1's "1") and a
    group "2" that generation 1 never made. A generation with its own store, or after one: none;
    a group grown past its earlier namesake: only the peers that had an address there."""
    first = _gen(1, {"0": [0, 1, 2], "1": [0, 1]})
    second = _gen(2, {"0": [0, 1, 2], "1": [0, 2], "2": [1, 2]})
    report = type("R", (), {"notes": stale_address_notes([first, second])})()
    assert noted_stale_address_races(report) == {0: [(2, "gen2/WORLD"), (2, "gen2/pg1")], 1: [(2, "gen2/WORLD")],
                                                 2: [(2, "gen2/WORLD"), (2, "gen2/pg1")]}
    assert stale_address_notes([first, _gen(2, {"0": [0, 1, 2]}, hosted=True)]) == []
    assert stale_address_notes([_gen(1, {"0": [0, 1, 2]}, hosted=True), _gen(2, {"0": [0, 1, 2]})]) == []
    grown = stale_address_notes([_gen(1, {"0": [0, 1, 2], "1": [0, 1]}), _gen(2, {"0": [0, 1, 2], "1": [2, 1, 0]})])
    assert [n for n in grown if "gen2/pg1" in n] == [  # group rank 2 (rank 0) posted nothing in generation 1's "1"
        stale_address_note(2, 2, "gen2/pg1", 1, [1]), stale_address_note(1, 2, "gen2/pg1", 1, [2]),
        stale_address_note(0, 2, "gen2/pg1", 1, [2, 1])]
    assert stale_address_notes([first]) == []


def test_reinit_same_process_is_noted_on_every_rank_of_the_second_world_and_compare_never_excuses_it(script_zygote):
    """`examples/reinit_same_process.py` (3 ranks): the second generation's world reads its
    peers' addresses where the first's left theirs (plain torchrun: 3 of 6 runs completed); its
    subgroup is new in generation 2. A real run failing so would be a fault of simdist's own
    isolation of the generations: a difference, named no race."""
    sim = _run({"script": "reinit_same_process.py", "nproc": 3}, "sim", script_zygote)
    assert noted_stale_address_races(sim) == {r: [(2, "gen2/WORLD")] for r in range(3)}, sim.notes
    real = copy.deepcopy(sim)
    real.source = "real"
    stale = real.ranks[1]
    refused = "Gloo connectFullMesh failed with [pair.cc:144] Connection refused"  # as both sides categorise it
    stale.status, stale.error = "error", RankError("RuntimeError", refused, error_category(refused, runtime_error=True))
    stale.trace = [e for e in stale.trace if not e.group.startswith("gen2/")]
    cmp = compare_reports(sim, real)
    assert not cmp.agree and named_races(sim, real, cmp) == []
