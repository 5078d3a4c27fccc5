"""The random script generator of the script sweep (`simdist.testing.scripts`,
bench/script_sweep.py), without running any script: what it writes is valid Python that
a torchrun-style launch can start, a function of its seed, and over some seeds it uses
every feature it names."""

from __future__ import annotations

import ast
import random
import re

from simdist.testing.scripts import FEATURES, HANGS, random_script, sweep_script


def _scripts(seed: int, n: int, worlds=(2, 4)):
    rng = random.Random(seed)
    return [random_script(rng, f"case{seed}_{k}", worlds) for k in range(n)]


def test_scripts_are_valid_python_with_a_main_that_initialises_gloo():
    for g in _scripts(0, 60):
        tree = ast.parse(g.source, filename=g.name)
        names = {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
        assert {"main", "show"} <= names, g.name
        assert 'dist.init_process_group("gloo"' in g.source
        assert 2 <= g.world <= 4 and g.features <= set(FEATURES), (g.name, g.features)
        steps = ast.literal_eval(next(line for line in g.source.splitlines() if line.startswith("STEPS = "))
                                 .split("=", 1)[1].split("#")[0])
        assert len(steps) == g.world and all(s >= 0 for s in steps)
        assert ("uneven" in g.features) == (len(set(steps)) > 1)
        # a script that can hang sets Gloo's timeout, so that real Gloo ends it too
        assert ("timeout" in g.features) == ('dist.init_process_group("gloo", timeout=timeout)' in g.source)
        for line in g.source.splitlines():  # a subgroup gets the same timeout (torch's default is 30 min)
            if "dist.new_group(" in line or "dist.new_subgroups" in line:
                assert ("timeout" in g.features) == ("], timeout=timeout" in line), (g.name, line)
        if g.features & HANGS:
            assert "timeout" in g.features
        _no_p2p_while_async_work_is_pending(g)


def _no_p2p_while_async_work_is_pending(g) -> None:
    """Every async work is waited before a send or receive is issued: a rank that aborts in
    the collective would otherwise race the send on real Gloo."""
    pending: set[str] = set()
    for line in g.source.splitlines():
        if m := re.search(r"(work\d+) = dist\.", line):
            pending.add(m.group(1))
        if m := re.search(r"(work\d+)(?:\.get_future\(\))?\.wait\(\)", line):  # or through its future
            pending.discard(m.group(1))
        assert not (pending and re.search(r"dist\.(i?send|i?recv)\(", line)), (g.name, line)


def test_async_work_waited_through_its_future_is_waited_before_p2p():
    """The scripts of seeds 4, 7 and 8 wait an async collective through its future
    (`future_wait`) and send or receive after it; the check took such work as never waited."""
    for seed in (4, 7, 8):
        for g in _scripts(seed, 40):
            _no_p2p_while_async_work_is_pending(g)


def test_a_seed_gives_the_same_scripts_and_a_case_regenerates_alone():
    a, b = _scripts(7, 12), _scripts(7, 12)
    assert [g.source for g in a] == [g.source for g in b]
    assert sweep_script(7, 9).source == a[9].source
    assert [g.source for g in _scripts(8, 12)] != [g.source for g in a]


def test_every_feature_appears_over_some_seeds_and_world_sizes_are_honoured():
    seen: set[str] = set()
    for seed in range(4):
        for g in _scripts(seed, 40):
            seen |= g.features
    assert seen == set(FEATURES)
    assert {g.world for g in _scripts(3, 30, worlds=(3, 3))} == {3}
