"""The Join tutorial's three programs, exactly as published (nccl, cuda:{rank}, device_ids, mp.spawn),
run on simulated ranks on this CPU-only machine: they print the tutorial's lines, and each rank's
collective sequence is the one the scenario path simulates for the same loop (scenarios checked
against real Gloo's Flight Recorder by test_fidelity/test_real_backend)."""

from __future__ import annotations

import pytest

from simdist.frames import qualname_at
from simdist.scenario import load_scenario
from simdist.sim import simulate
from tests.conftest import EXAMPLES, SCENARIOS, trace_keys

pytestmark = pytest.mark.real


@pytest.fixture
def run(example_run):
    """`run(name)`: the program as-is (it starts its own ranks) on simulated ranks: the
    session's run of it (`example_run`; no process of it survives it)."""
    return example_run


def _scenario_traces(name: str) -> list[list[tuple]]:
    return [trace_keys(r.trace) for r in simulate(load_scenario(SCENARIOS / name)).ranks]


def test_ddp_program_prints_the_tutorials_lines_and_the_scenarios_collectives(run):
    rep = run("join_tutorial_ddp.py")
    assert rep.outcome == "completed" and rep.backend == "nccl" and rep.world_size == 2
    assert [r.output for r in rep.ranks] == [["Rank 0 has exhausted all 5 of its inputs!"],
                                              ["Rank 1 has exhausted all 6 of its inputs!"]]
    assert [trace_keys(r.trace) for r in rep.ranks] == _scenario_traces("ddp_join_uneven.toml")
    assert all(e.completed for r in rep.ranks for e in r.trace)
    assert [r.exit for r in rep.ranks] == ["returned normally"] * 2


def test_ddp_zero_program(run):
    rep = run("join_tutorial_ddp_zero.py")
    assert rep.outcome == "completed"
    assert [r.output for r in rep.ranks] == [["Rank 0 has exhausted all 5 of its inputs!"],
                                              ["Rank 1 has exhausted all 6 of its inputs!"]]
    assert [trace_keys(r.trace) for r in rep.ranks] == _scenario_traces("ddp_zero_join.toml")


# The scenario models the tutorial's Counter as a built-in joinable; in the script it is the
# user's own class, so its calls carry user.<file>:<line> labels: the line must lie in the
# function the scenario's label names.
_COUNTER_FUNCTIONS = {
    "counter.call.allreduce": "Counter.__call__",
    "counter.main_hook.allreduce": "CounterJoinHook.main_hook",
    "counter.post_hook.find_common_rank": "Counter.find_common_rank",
    "counter.post_hook.broadcast_max_count": "CounterJoinHook.post_hook",
}


def test_counter_program_prints_10_11_11_11(run):
    path = EXAMPLES / "join_tutorial_counter.py"
    rep = run(path.name)
    assert rep.outcome == "completed"
    assert [r.output for r in rep.ranks] == [
        ["10 inputs processed before rank 0 joined!", "11 inputs processed across all ranks!"],
        ["11 inputs processed before rank 1 joined!", "11 inputs processed across all ranks!"],
    ]
    expected = _scenario_traces("counter_tutorial.toml")
    for rank, r in enumerate(rep.ranks):
        assert len(r.trace) == len(expected[rank])
        for got, want in zip(trace_keys(r.trace), expected[rank], strict=True):
            origin, want_origin = got[5], want[5]
            if want_origin in _COUNTER_FUNCTIONS:
                assert origin.startswith(f"user.{path.name}:")
                assert qualname_at(str(path), int(origin.rsplit(":", 1)[1])) == _COUNTER_FUNCTIONS[want_origin]
                got, want = got[:5] + got[6:], want[:5] + want[6:]
            assert got == want
