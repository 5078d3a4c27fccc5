"""Generations of ranks (`simdist.script.generations`): a script whose default process group
is initialised more than once, by new processes (a second `mp.spawn`: the DDP tutorial, the
`two_spawns_train_then_evaluate.py` example) or by the same ones after `destroy_process_group`
(`reinit_same_process.py`, `tests/scripts/generations.py`). Each generation is a world of
its own on both sides: its groups are named `gen<k>/...` in both reports, and the
simulator's and real Gloo's per-rank sequences, outcomes and printed lines must agree.
The examples' agreement is checked with the others (tests/test_script_examples.py)."""

from __future__ import annotations

import copy
import subprocess

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.engine.core import Engine
from simdist.script import env
from simdist.script.api import compare_script
from simdist.script.generations import Generation, joining, latest, new_generation, summary
from simdist.script.launch import new_run_id, tagged_processes
from simdist.script.ranks import RankConn, Timeline, ZeroCost
from tests.conftest import ROOT, descendants, line_of

GENERATIONS = ROOT / "tests" / "scripts" / "generations.py"


def test_group_names_say_their_generation():
    assert env.group_name("0", True) == "WORLD" and env.group_name("0", True, 2) == "gen2/WORLD"
    assert env.group_name("1", False, 3) == "gen3/pg1"
    assert [env.generation_of(g) for g in ("WORLD", "pg1", "gen2/WORLD", "gen12/pg3")] == [1, 1, 2, 12]


def _gen(index: int, size: int, ranks: list[int]) -> Generation:
    g = Generation(index, size, Engine(size, {env.group_name("0", True, index): list(range(size))}, ZeroCost()),
                   Timeline(ZeroCost()))
    g.by_rank = {r: RankConn(None, rank=r) for r in ranks}  # type: ignore[arg-type]
    return g


def test_an_init_joins_the_oldest_generation_still_waiting_for_that_rank():
    """A generation is open until all its ranks joined; a rank already in every open one starts
    the next (whose world size is its own: generations may differ in size)."""
    full, waiting = _gen(1, 2, [0, 1]), _gen(2, 3, [2])
    assert joining([full, waiting], 0) is waiting and joining([full, waiting], 2) is None
    assert joining([full], 1) is None and joining([], 0) is None
    assert latest([full, waiting], 2) is waiting.by_rank[2] and latest([full, waiting], 0) is full.by_rank[0]
    g = new_generation(3, 4, "gloo", lambda n: ZeroCost())
    assert (g.index, g.world_size, g.world(), g.engine.groups) == (3, 4, "gen3/WORLD", {"gen3/WORLD": [0, 1, 2, 3]})
    assert summary([full]) is None
    assert "initialised 2 times (1: 2 ranks; 2: 3 ranks, ranks [0, 1] never joined)" in summary([full, waiting])


def _both(case: str, nproc: int, zygote, extra: list[str] | None = None, **kw):
    run_id = new_run_id()
    both = compare_script(GENERATIONS, ["--case", case, *(extra or [])], nproc_per_node=nproc, backend="gloo", run_id=run_id,
                          measure_compute=False, zygotes=zygote, **{"timeout_s": 60, **kw})
    assert tagged_processes(run_id) == [] and all(descendants(zygote(m).pid) == [] for m in ("sim", "gloo"))
    return both.sim.report, both.real.report


def _groups(report) -> list[list[tuple[str, str, int]]]:
    return [[(e.op, e.group, e.seq) for e in r.trace] for r in report.ranks]


@pytest.mark.real
def test_a_generation_started_while_a_peer_is_still_in_the_old_one_agrees(script_zygote):
    """Rank 0 destroys and initialises again while rank 1 still computes in generation 1: its
    generation-2 all_reduce waits for rank 1 to join (each generation meets at its own store
    keys on real Gloo, as under a store rank 0 hosts), and nothing pairs across generations."""
    sim, real = _both("overlap", 2, script_zygote)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * 2, rep.source
        assert _groups(rep) == [[("all_reduce", "WORLD", 1), ("all_reduce", "gen2/WORLD", 1),
                                 ("barrier", "gen2/WORLD", 2)]] * 2, rep.source
        assert rep.ranks[1].output == ["gen1 [1/2] [3.0, 3.0]", "gen2 [1/2] [10.0, 12.0, 14.0]"]
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    # a simulator that put generation 2's first all_reduce in generation 1 differs from real Gloo
    other = copy.deepcopy(sim)
    other.ranks[0].trace[1].group = "WORLD"
    c = compare_reports(other, real)
    assert not c.agree and {d.field for d in c.differences if d.rank == 0} == {"trace"}


@pytest.mark.real
def test_a_smaller_second_generation_agrees(script_zygote):
    """3 ranks, then a generation of 2: rank 2 leaves after generation 1, ranks 0 and 1 meet
    again in a world of 2."""
    sim, real = _both("shrink", 3, script_zygote)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * 3, rep.source
        assert [len(r.trace) for r in rep.ranks] == [3, 3, 1]
        assert {e.group_size for e in rep.ranks[0].trace if e.group.startswith("gen2/")} == {2}, rep.source
        assert rep.ranks[2].output == ["gen1 [2/3] [6.0, 6.0]", "gen1 [2] leaves"]
    assert any("initialised 2 times (1: 3 ranks; 2: 2 ranks)" in n for n in sim.notes)
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


@pytest.mark.real
def test_a_hang_in_the_second_generation_is_found_and_explained_on_both_sides(script_zygote):
    """Rank 1 receives what rank 0 never sends in generation 2. The simulator proves the hang
    at once and names each rank's blocked operation in gen2/WORLD and its line; real Gloo's
    ranks, found stalled (`simdist.script.stalls`), answer with the same (`collect_records`)."""
    sim, real = _both("hang", 2, script_zygote, hang_after_s=0.5)
    at_recv = line_of(GENERATIONS, "dist.recv(torch.zeros(1), src=0)")
    at_reduce = line_of(GENERATIONS, "dist.all_reduce(t)", after="dist.recv(torch.zeros(1), src=0)")
    for rep in (sim, real):
        r0, r1 = rep.ranks
        assert [r.status for r in rep.ranks] == ["hang", "hang"], rep.source
        assert (r0.blocked_in.op, r0.blocked_in.group, r0.blocked_in.seq) == ("all_reduce", "gen2/WORLD", 2)
        assert (r1.blocked_in.op, r1.blocked_in.group, r1.blocked_in.peer) == ("recv", "gen2/WORLD", 0)
        assert (r0.location.line, r1.location.line) == (at_reduce, at_recv), rep.source
    # found by the stall rule in generation 2 too (its Flight Recorder's counters are keyed by
    # ids that go on across generations, not by torch's group names, which restart)
    assert any(n.startswith("hang found early (--hang-after 0.5 s") for n in real.notes), real.notes
    notes = "\n".join(sim.notes)
    assert "rank 1 is blocked in #1 recv[1] float32 peer=0 group=gen2/WORLD" in notes
    assert "hang: every live rank is blocked" in notes and "p2p_unmatched" in {f.kind for f in sim.findings}
    c = compare_reports(sim, real)
    assert c.agree and not any(rc.unrecorded for rc in c.ranks), format_comparison(c)


def test_a_rank_that_destroyed_its_group_is_reported_as_it_ends_not_killed_by_the_hang(script_zygote):
    """Under NCCL's rule (a peer's exit leaves its partners waiting: the script asks for NCCL)
    rank 0 runs out of batches, destroys its group and returns; rank 1 waits in DDP's next
    broadcast for good. Rank 0's process still runs after its destroy: the hang is proven only
    once it has ended, so it is reported as it ended (returned normally), not as killed by the
    hang's clean-up (it was: 'killed by signal 9' at loss.backward(), an error)."""
    from simdist.script import run_script

    rep = run_script(ROOT / "examples" / "fuzz_ddp_dataloader_no_join.py", nproc_per_node=2, batches=[1, 2],
                     backend="nccl", timeout_s=60, zygote=script_zygote("sim"), stdout=subprocess.DEVNULL)
    assert rep.outcome == "hang"
    assert [r.status for r in rep.ranks] == ["completed", "hang"]
    assert rep.ranks[0].error is None


@pytest.mark.real
def test_a_larger_second_generation_in_the_same_processes_agrees(script_zygote, tmp_path):
    """3 processes: ranks 0 and 1 make a world of 2 while rank 2's process waits outside torch;
    then all 3 meet in a second generation of 3 (larger than the first)."""
    sync = tmp_path / "gen1-done"
    sim, real = _both("grow", 3, script_zygote, extra=["--sync", str(sync)])
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * 3, (rep.source, rep.notes)
        assert _groups(rep) == [[("all_reduce", "WORLD", 1), ("all_reduce", "gen2/WORLD", 1),
                                 ("barrier", "gen2/WORLD", 2)]] * 2 + [[("all_reduce", "gen2/WORLD", 1),
                                                                       ("barrier", "gen2/WORLD", 2)]], rep.source
        assert {e.group_size for r in rep.ranks for e in r.trace} == {2, 3} and rep.world_size == 3, rep.source
        assert rep.ranks[2].output == ["gen1 [2] waited", "gen2 [2/3] [30.0, 33.0, 36.0]"], rep.source
    assert any("initialised 2 times (1: 2 ranks; 2: 3 ranks)" in n for n in sim.notes), sim.notes
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


@pytest.mark.real
def test_initialising_twice_without_destroying_raises_torchs_own_error_on_both_sides(script_zygote):
    """torch raises ValueError("trying to initialize the default process group twice!") at the
    second `init_process_group` (distributed_c10d.py); the simulator raises the same there."""
    sim, real = _both("twice", 2, script_zygote)
    at = line_of(GENERATIONS, 'dist.init_process_group("gloo")')
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["error"] * 2, (rep.source, rep.notes)
        for r in rep.ranks:
            assert (r.error.type, r.error.message) == ("ValueError", "trying to initialize the default process "
                                                       "group twice!"), rep.source
            assert r.location.line == at, rep.source
        assert not any("initialised 2 times" in n for n in rep.notes), rep.notes
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


@pytest.mark.real
def test_a_peers_exit_in_the_second_generation_fails_the_wait_not_called_a_hang(script_zygote):
    """Rank 0 waits (stalled, by its own account) in generation 2 for 1.5 s, five times the
    settle period, while rank 1 sleeps and then exits: on real Gloo rank 0's all_reduce fails
    once rank 1's process is gone. The stall rule must count that end (it judged only the
    processes still connected, and called the run hung the moment rank 1's closed)."""
    sim, real = _both("leave", 2, script_zygote, hang_after_s=0.3)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["error", "completed"], (rep.source, rep.notes)
        assert "Connection closed by peer" in rep.ranks[0].error.message, rep.source
        assert not any("hang found early" in n for n in rep.notes), rep.notes
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


@pytest.mark.real
def test_a_process_that_destroyed_its_group_and_lives_on_is_no_part_of_a_hang(script_zygote):
    """Ranks 0 and 1 each receive from the other (a hang) while rank 2 has destroyed its group
    and sleeps 1 s, prints and exits. On real Gloo rank 2 is not stalled (it sleeps), so the
    hang is called only after it exited, normally. The simulator must not prove the hang (and
    kill rank 2) while rank 2 still runs: it would lose its line and call it killed."""
    sim, real = _both("linger", 3, script_zygote, hang_after_s=0.3)
    at = line_of(GENERATIONS, "dist.recv(torch.zeros(1), src=1 - rank)")
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["hang", "hang", "completed"], (rep.source, rep.notes)
        assert rep.ranks[2].output == ["gen1 [2/3] [6.0, 6.0]", "gen1 [2] bye"], rep.source
        assert [r.location.line for r in rep.ranks[:2]] == [at, at], rep.source
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


@pytest.mark.real
def test_a_refused_second_init_is_the_ranks_error(script_zygote):
    """A rank that initialises again as a rank out of range is refused (bad input simdist
    names): the RuntimeError it raises is its end, in its earlier membership (the refusal
    ended that membership first, and the rank read as having completed); the refused rank
    makes no generation, so another rank's second generation is unaffected, in either order."""
    sim, real = _both("refused", 2, script_zygote)
    at = line_of(GENERATIONS, "dist.init_process_group(\"gloo\", rank=5 if r == 1")
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed", "error"], (rep.source, rep.notes)
        r1 = rep.ranks[1]
        assert (r1.error.type, r1.error.message) == ("RuntimeError", "simdist: rank 5 is out of range for "
                                                     "world_size=2"), rep.source
        assert r1.location.line == at and rep.ranks[0].output[-1] == "gen2 [0/1] alone", rep.source
        assert any(f.kind == "rank_error" and "rank 5 is out of range" in f.detail for f in rep.findings), rep.source
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


def test_refused_inits_name_why_and_make_no_generation():
    """The refused cases: a second live process as a rank already in the generation, a world
    size other than the generation's, a rank out of range. Each is the rank's error (and a
    rank_error finding), and none makes a generation: one with no member would wait for good
    and refuse every later init of another size."""
    import socket

    from simdist.script.coordinator import Coordinator

    with socket.socket(socket.AF_UNIX, socket.SOCK_STREAM) as listener:
        coord = Coordinator(listener, lambda n: ZeroCost(), backend="gloo", measure_compute=False)
        replies: list[dict] = []
        coord._send = lambda conn, header, buffers=(): replies.append(header)  # type: ignore[method-assign]

        def init(rank: int, size: int) -> str | None:
            before = len(replies)
            coord._init(RankConn(None), {"t": "init", "rank": rank, "world_size": size, "req": 1,  # type: ignore[arg-type]
                                         "backend": "gloo"})
            return replies[-1]["error"] if len(replies) > before else "waits"

        assert init(0, 2) == "waits"  # for the rest of its world (`simdist.script.rendezvous`)
        assert init(0, 2) == "two processes initialised as rank 0"
        assert init(1, 3) == "rank 1 initialised with world_size=3, other ranks with 2"
        assert init(7, 2) == "rank 7 is out of range for world_size=2"
        assert init(3, 3) == "rank 3 is out of range for world_size=3"
        assert len(coord.gens) == 1 and init(1, 2) is None and coord.gens[0].complete()
        assert [r["error"] for r in replies[-2:]] == [None, None]  # both answered once the world is there
        assert coord.protocol_errors == [r["error"] for r in replies if r["error"]] and len(coord.protocol_errors) == 4
        coord.sel.close()
