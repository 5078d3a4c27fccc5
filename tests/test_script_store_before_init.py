"""A store used before `init_process_group` (`tests/scripts/store_before_init.py`), on real Gloo
and the simulator. Before, every such call on a simulated rank raised "simdist: a store call
(...) before the rank's init_process_group is not modelled" (real Gloo: the exchange
completed), and torch's env:// rendezvous store (`dist.rendezvous("env://")`) was torch's own
client of torchrun's port, which nothing serves on either side (both timed out connecting).
Now a call before init is answered as it comes, its wait's timeout on the wall clock
(`simdist.script.earlykeys`), and rank 0's own server waits for its workers."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from simdist.script.keystore import wait_timeout
from simdist.script.launch import new_run_id, tagged_processes
from simdist.script.stores import connect_timeout, host_timeout
from tests.conftest import ROOT

SCRIPT = ROOT / "tests" / "scripts" / "store_before_init.py"


def _compare(zygote, args: list[str], nproc: int | None):
    run_id = new_run_id()
    both = compare_script(SCRIPT, args, nproc_per_node=nproc, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=zygote, timeout_s=90, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    return both.sim.report, both.real.report


def _exchanged(rep, nproc: int, keys: int) -> None:
    """Every rank read rank 0's run id, counted every rank in, and saw the keys after init."""
    assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
    for r in range(nproc):
        out = rep.ranks[r].output
        assert f"{r} run id b'run-42'" in out and f"{r} arrived {nproc} check False" in out, (rep.source, out)
        assert out[-1] == f"{r} after init True {keys}", (rep.source, out)


@pytest.mark.real
@pytest.mark.parametrize(("mode", "nproc"), [("exchange", 2), ("exchange", 3), ("rendezvous", 2)])
def test_a_custom_launchers_store_exchange_before_init_agrees(script_zygote, mode, nproc):
    """torchrun-style: each rank's own client of MASTER_PORT (or env://'s store) before init:
    set, get, add, wait for every rank's key; after init the same store holds them beside
    torch's (TCPStore's count, the script's 2 + a key a rank, Gloo's address of each rank)."""
    sim, real = _compare(script_zygote, [mode], nproc)
    for rep in (sim, real):
        _exchanged(rep, nproc, 1 + 2 + 2 * nproc)
    assert sim.ranks[0].output[0] == ("0 rendezvous 0 2 TCPStore" if mode == "rendezvous" else "0 run id b'run-42'")


@pytest.mark.real
def test_a_wait_before_init_times_out_with_torchs_words_on_the_wall_clock(script_zygote):
    sim, real = _compare(script_zygote, ["timeout"], 2)
    for rep in (sim, real):
        assert rep.ranks[1].output == [
            f"1 {' '.join(wait_timeout(1.0, ['never']))} in time True",
            f"1 {' '.join(wait_timeout(0.5, ['never', 'nor']))} in time True", "1 after init False 3"], rep.source


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_rank_0s_own_server_waits_for_its_workers_before_init(script_zygote, nproc):
    """mp.spawn: rank 0's `TCPStore(..., is_master=True)` returns once every worker's client
    (1 s late) counted in; the ranks exchange through it, then init with it."""
    sim, real = _compare(script_zygote, ["spawn", "server", str(nproc)], None)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        assert rep.ranks[0].output[0] == "0 server waited for its workers True", rep.source
        assert all(f"{r} arrived {nproc} check False" in rep.ranks[r].output for r in range(nproc)), rep.source


@pytest.mark.real
def test_rank_0s_own_server_times_out_waiting_for_a_missing_worker(script_zygote):
    """The last worker never makes its client: rank 0 raises TCPStore's words after floor(T) + 1
    seconds (T = 1 s: 2 s, 2 of 3 clients)."""
    sim, real = _compare(script_zygote, ["spawn", "missing", "3"], None)
    for rep in (sim, real):
        assert rep.ranks[0].output == [f"0 {' '.join(host_timeout(1.0, 2, 3))} after 2 s True"], rep.source
        assert [r.status for r in rep.ranks] == ["completed"] * 3, rep.source


@pytest.mark.real
def test_a_client_made_before_rank_0s_server_is_up_gives_up_connecting(script_zygote):
    """Rank 0 never makes its server: each worker's client (timeout 1 s) raises torch's connect
    timeout naming the address it was given, after its timeout or more (torch retries with a random
    back-off: 1.9 s measured once, under 1.5 s in another run)."""
    sim, real = _compare(script_zygote, ["spawn", "noserver", "3"], None)
    for rep in (sim, real):
        for r in (1, 2):
            assert rep.ranks[r].output == [f"{r} {' '.join(connect_timeout(1.0, ('127.0.0.1', 29516)))} after its timeout True"], rep.source
