"""The store's keys across generations of ranks (`tests/scripts/store_generations.py`), on real
Gloo and the simulator. Under torchrun the agent's one TCPStore holds every generation's keys:
after destroy and init again a script's own client counts and lists the first generation's
keys, and the new default store reads them (measured under `torchrun --standalone`, 2 and 3
ranks: the lines below). Before, the real side's later generation met at `simdist/gen2/...`
(num_keys one group's Gloo keys more than torchrun's) and the simulator's held only its own
generation's keys (the first's `get` waited for good). Under `mp.spawn` rank 0 hosts a new
store each spawn: the second spawn's client sees its own keys only, on both sides."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "scripts" / "store_generations.py"


def _compare(zygote, args: list[str], nproc: int | None):
    run_id = new_run_id()
    both = compare_script(SCRIPT, args, nproc_per_node=nproc, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=zygote, timeout_s=90, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    return both.sim.report, both.real.report


def _gloo(group: str, ranks: range) -> list[str]:
    return [f"default_pg/0//{group}cpu//0/{r}" for r in ranks]


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_a_second_init_in_the_same_processes_sees_the_first_generations_keys(script_zygote, nproc):
    """torchrun's listing (num_keys counts TCPStore's own key too): after init the counter and
    Gloo's key of each rank; after `new_group([0, 1])` its two keys and the script's; the same
    after destroy, after init again (its Gloo keys rewritten under their names) and its second
    group; every rank reads the first generation's keys in the second; the counter is both
    generations'."""
    sim, real = _compare(script_zygote, ["reinit"], nproc)
    first = sorted(["default_pg/0//count", *_gloo("", range(nproc))])
    later = sorted([*first, *_gloo("1//", range(2)), "default_pg/0//dflt", "mine"])
    rank0 = [f"init1 {len(first) + 1} {first}"] + [f"{step} {len(later) + 1} {later}" for step in
                                                    ("group1", "destroyed", "init2")]
    reads = "gen2 reads b'through default_pg' b'through default_pg' b\"rank 0's own\" True"
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        assert [r.output for r in rep.ranks] == [
            [*rank0, f"0 {reads}", f"group2 {len(later) + 1} {later}", f"count {2 * nproc}"]] + [
            [f"{r} {reads}"] for r in range(1, nproc)], rep.source


@pytest.mark.real
def test_a_second_inits_wait_for_a_missing_peers_address_names_torchs_key(script_zygote):
    """Generation 2's Gloo rendezvous meets its own addresses (`rank.genkeys` on the real side),
    and its timeout names the key as torch names it, on both sides: before, the real side's
    said `/simdist/gen2/default_pg/0//cpu//0/1`. (Real torchrun's rank 0 may read rank 1's
    address of generation 1 there instead and fail connecting: its stale-address race, noted.)"""
    sim, real = _compare(script_zygote, ["missing"], 2)
    for rep in (sim, real):
        assert rep.ranks[0].output == ["0 DistStoreError wait timeout after 2000ms, keys: /default_pg/0//cpu//0/1"], rep.source


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_a_second_mp_spawn_meets_at_a_new_store_on_the_same_port(script_zygote, nproc):
    """`python store_generations.py spawn N` on plain torch: each spawn's rank 0 hosts a store of
    its own at the script's port; a client of it sees that spawn's keys only."""
    sim, real = _compare(script_zygote, ["spawn", str(nproc)], None)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        assert rep.ranks[0].output == [
            line for k in (1, 2) for line in (f"spawn{k} {nproc + 2} {sorted([*_gloo('', range(nproc)), f'spawn{k}'])}",
                                              f"spawn1's key {k == 1}")], rep.source


@pytest.mark.real
def test_a_second_mp_spawn_whose_rank_0_serves_the_port_itself_gets_a_new_store(script_zygote):
    """`python store_generations.py own_server 3`: each spawn's rank 0 makes its own TCPStore
    server at the script's port before init (the others clients) and gives it to init (whose
    keys then have no `default_pg/` prefix: torch adds it only to a store it makes); the
    second spawn binds the port again and sees its own keys only (measured: these lines). The
    server is the run's on both sides (`ownstore._ahead`: the real side's at its own port, the
    simulator's the shared store, a key space of the generation's own); before, a real server
    at the script's port 29514 on both sides, which two runs at once shared."""
    sim, real = _compare(script_zygote, ["own_server", "3"], None)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * 3, rep.source
        assert rep.ranks[0].output == [
            line for k in (1, 2) for line in (f"spawn{k} 5 {sorted([f'0//cpu//0/{r}' for r in range(3)] + [f'spawn{k}'])}",
                                              f"spawn1's key {k == 1}")], rep.source


@pytest.mark.real
def test_a_client_made_before_the_init_that_hosts_its_port_reaches_that_store(script_zygote):
    """`python store_generations.py early 3` on plain torch: ranks 1 and 2 make their client of
    the script's port before init, rank 0 after it; every rank reads its spawn's count, 3, and
    the second spawn's client sees a new store. Before, both sides timed out connecting
    ("The client socket has timed out after 20000ms while trying to connect to (127.0.0.1,
    29514)"): a client made before init was not routed."""
    sim, real = _compare(script_zygote, ["early", "3"], None)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * 3, rep.source
        assert [r.output for r in rep.ranks] == [
            [f"{r} n1 3 29514 True", f"{r} n2 3 29514 False"] for r in range(3)], rep.source
