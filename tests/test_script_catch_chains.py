"""Gloo rules whose chains torchrun's agent now cuts short, end to end again.

Torchrun-style (`--nproc-per-node`), once a rank's process fails the agent SIGTERMs the others
(`simdist.script.agent`), so in the scripts kept for these rules the later links (rank 1's own
timeout in timed_out_sent.py, the late rank's refused connect in init and in new_group,
pg_timeouts' late rank losing its peers, ...) are ended by the agent before they happen. Each
script's `--catch` variant has every rank catch its error, print it and exit 0: no process
fails, torchrun's agent never acts, and the whole chain shows. Each case runs on simulated
ranks and on real Gloo; both must print the rule's lines, and agree (or differ only by a race
of real Gloo the case names: a group's connection, or the late rank's connect refused or
timed out, `simdist.races`).
"""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.races import named_races
from simdist.report import Report
from simdist.vocab import AGENT_TERMINATED
from tests.test_script_examples import RACE_TRIES, _run

S = "../tests/scripts/"
# id -> (entry, each rank's printed lines, the races of real Gloo that may remain)
CHAINS = {
    "timed_out_sent": ({"script": S + "timed_out_sent.py", "nproc": 3, "args": ["--catch"]},
                       [["[0] timed out"], ["[1] timed out"], ["[2] peer gone"]], ()),
    "timed_out_root_fed": ({"script": S + "timed_out_root_fed.py", "nproc": 3, "args": ["--catch"]},
                           [["[0] timed out"], ["[1] got [0.0, 0.0, 0.0, 0.0]"], ["[2] peer gone"]], ()),
    "closed_pair_unfed": ({"script": S + "closed_pair_reach.py", "nproc": 3, "args": ["--case", "unfed", "--catch"]},
                          [["[0] peer gone"], [], ["[2] peer gone"]], ()),
    "pg_slow": ({"script": S + "pg_timeouts.py", "nproc": 3, "args": ["--case", "slow", "--catch"]},
                [["rank 0: timed out"], ["rank 1: peer gone"], ["rank 2: timed out"]], ()),
    "pg_wait_timeout": ({"script": S + "pg_timeouts.py", "nproc": 3, "args": ["--case", "wait_timeout", "--catch"]},
                        [["rank 0: Operation timed out!", "rank 0: timed out"], ["rank 1: peer gone"],
                         ["rank 2: Operation timed out!", "rank 2: timed out"]], ()),
    "pg_monitored_sub": ({"script": S + "pg_timeouts.py", "nproc": 3, "args": ["--case", "monitored_sub", "--catch"]},
                         [["rank 0: done [0.0, 0.0, 0.0, 0.0]"],
                          ["rank 1: [Rank 0]: Rank 1 failed to pass monitoredBarrier in 1000 ms"],
                          ["rank 2: done [2.0, 2.0, 2.0, 2.0]"]], ()),
    "init_sleeps2": ({"script": S + "init_waits_for_world.py", "nproc": 3, "args": ["sleeps2", "0.5", "--catch"]},
                     [["0 init raised DistStoreError (store timeout)"], ["1 init raised DistStoreError (store timeout)"],
                      ["2 init raised RuntimeError (connectFullMesh)"]], ("rendezvous",)),
    "init_computes": ({"script": S + "init_waits_for_world.py", "nproc": 2, "args": ["computes1.5", "0.3", "--catch"]},
                      [["0 raised before the last rank came", "0 init raised DistStoreError (store timeout)"],
                       ["1 init raised RuntimeError (connectFullMesh)"]], ("rendezvous",)),
    "new_group_sleeps2": ({"script": S + "new_group_member_skips.py", "nproc": 2, "args": ["sleeps2", "0.5", "--catch"]},
                          [["0 new_group raised DistStoreError (store timeout)"],
                           ["1 new_group raised RuntimeError (connectFullMesh)"]], ("rendezvous",)),
}
# Real Gloo's group connection may race on a loaded host (`simdist.races.ConnectRace`): that
# run is repeated (at most RACE_TRIES times) and must once show the case's outcome.
RETRIED = ("connect",)


def _agent_free(rep: Report) -> None:
    """No rank's process failed, so torchrun's agent never acted on this side."""
    assert not [r.rank for r in rep.ranks if r.exit is not None and r.exit.startswith(AGENT_TERMINATED)], rep.source
    assert not [n for n in rep.notes if "agent race" in n or AGENT_TERMINATED in n], rep.notes


@pytest.mark.real
@pytest.mark.parametrize("case", list(CHAINS))
def test_the_chain_shows_on_both_sides_when_every_rank_catches(case, script_zygote):
    entry, lines, remaining = CHAINS[case]
    sim = _run(entry, "sim", script_zygote)
    _agent_free(sim)
    assert [r.output for r in sim.ranks] == lines
    for _ in range(RACE_TRIES):
        real = _run(entry, "gloo", script_zygote)
        cmp = compare_reports(sim, real)
        races = [] if cmp.agree else named_races(sim, real, cmp)
        assert cmp.agree or races, format_comparison(cmp)
        assert all(r.kind in remaining + RETRIED for r in races), format_comparison(cmp)
        if all(r.kind in remaining for r in races):
            break
    else:
        pytest.fail(f"real Gloo raced ({RETRIED}) in {RACE_TRIES} runs: {format_comparison(cmp)}")
    _agent_free(real)
    assert [r.output for r in real.ranks] == lines


@pytest.mark.real
def test_a_timed_out_rank_had_sent_what_its_peer_received_by_each_ranks_own_timeout(script_zygote):
    """timed_out_sent.py's rule on the simulated clocks: rank 0 times out at its 0.3 s, rank 1
    at its own 1 s (not when rank 0 or rank 2 exited), and rank 2 loses rank 1 only then."""
    sim = _run(CHAINS["timed_out_sent"][0], "sim", script_zygote)
    assert [r.time for r in sim.ranks] == [pytest.approx(t, abs=0.05) for t in (0.3, 1.0, 1.0)]
    assert [r.trace[-1].op for r in sim.ranks] == ["all_gather", "send", "all_gather"]
