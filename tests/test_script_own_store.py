"""A script's own TCPStore client of torchrun's store address (MASTER_ADDR, MASTER_PORT), and
a second server a rank hosts itself: each script of `tests/scripts/own_store.py` runs on real
Gloo and the simulator (`rank.ownstore` routes such a client to the launcher's store on the
real side, to the coordinator's shared store in the simulator). Before, neither side served
MASTER_PORT: both timed out connecting, where torchrun's agent serves it."""

from __future__ import annotations

import json
import re
import socket
import subprocess
import sys

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from simdist.script.keystore import wait_timeout
from simdist.script.launch import TORCHRUN_PORT, new_run_id, tagged_processes
from simdist.script.stores import BIND_IGNORED
from tests.conftest import ROOT, line_of

SCRIPT = ROOT / "tests" / "scripts" / "own_store.py"


def _compare(zygote, args: list[str], nproc: int | None, script=SCRIPT):
    run_id = new_run_id()
    both = compare_script(script, args, nproc_per_node=nproc, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=zygote, timeout_s=90, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    sim, real = both.sim.report, both.real.report
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    return sim, real


@pytest.mark.real
@pytest.mark.parametrize(("mode", "nproc"), [("client", 2), ("client", 4), ("master", 3)])
def test_an_own_client_of_master_port_reaches_the_store_the_default_store_uses(script_zygote, mode, nproc):
    """Rank 0 sets a key through its own client and one through the default store; every rank
    reads both on its own client (the default store's as `default_pg/0//<key>`, torchrun's
    layout) and the counter they all added to. With is_master=(rank == 0) rank 0 is a client
    too: torchrun's agent holds the port."""
    sim, real = _compare(script_zygote, [mode], nproc)
    total = nproc * (nproc + 1) // 2
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        assert [r.output for r in rep.ranks] == [
            [f"{r} own TCPStore True True True", f"{r} got b\"rank 0's own\" b'through default_pg'", f"{r} count {total}"]
            for r in range(nproc)], rep.source


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_an_own_client_made_before_init_serves_as_inits_store(script_zygote, nproc):
    sim, real = _compare(script_zygote, ["before_init"], nproc)
    for rep in (sim, real):
        assert [r.output for r in rep.ranks] == [
            [f"{r} store is own: True", f"{r} joined b'{nproc}' port 29500"] for r in range(nproc)], rep.source


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_an_own_clients_timeout_raises_torchs_words_at_T_on_the_simulated_clock(script_zygote, nproc):
    sim, real = _compare(script_zygote, ["timeout"], nproc)
    last = nproc - 1
    for rep in (sim, real):
        err = rep.ranks[last].error
        assert rep.ranks[last].status == "error" and err is not None, rep.source
        assert (err.type, err.message) == wait_timeout(1.0, ["never"]), rep.source
        assert rep.ranks[last].location.line == line_of(SCRIPT, "its timeout ends it")
    assert sim.ranks[last].time == pytest.approx(1.0, abs=0.05)


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_a_second_server_a_rank_hosts_serves_the_simulated_ranks_too(script_zygote, nproc):
    """Not routed: rank 0's own TCPStore server on a free port is a real one on both sides (the
    simulated ranks are processes of this host); its port travels through the default store."""
    sim, real = _compare(script_zygote, ["second_port"], nproc)
    for rep in (sim, real):
        assert [r.output for r in rep.ranks] == [
            [f"{r} second b\"on rank 0's server\" True", f"{r} n {nproc}"] for r in range(nproc)], rep.source


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_queues_list_keys_and_num_keys_of_a_prefix_store_over_an_own_client(script_zygote, nproc):
    """TCPStore's queues (apart from the keys: a get or check of the name sees a non-empty
    one, `delete_key` and `list_keys` leave them out), a blocking pop's timeout words, a pop
    woken by a peer's push; `list_keys` under the prefix; `num_keys` counts the server's keys:
    Gloo's address of each rank, the script's, and TCPStore's own count of its workers.
    Before, the simulated store raised "queue support is not implemented" through a
    `PrefixStore` and counted the script's keys only."""
    sim, real = _compare(script_zygote, ["prefix"], nproc)
    gloo = [f"default_pg/0//cpu//0/{r}" for r in range(nproc)]
    rank0 = ["0 cs b'2' b'new' b'2'", "0 delete True False check True False",
             f"0 list ['a'] raw {sorted([*gloo, 'mine/a'])}", f"0 num_keys {nproc + 2} {nproc + 2}",
             "0 queue 2 True b'x' 1", "0 pop b'y' False 0 0", "0 key and queue apart b'2' 1 ['a']",
             "0 empty False QueueEmptyError queue is empty",
             "0 empty True DistStoreError wait timeout after 1000ms, keys: /mine/q"]
    last = [f"{nproc - 1} popped b'in a queue' list ['a']", f"{nproc - 1} waited b'for the last rank'"]
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        assert [r.output for r in rep.ranks] == [rank0] + [[]] * (nproc - 2) + [last], rep.source


@pytest.mark.real
def test_every_group_a_rank_makes_leaves_gloos_address_key_on_both_sides(script_zygote):
    """WORLD, `new_group([0, 1])` and one group a rank (use_local_synchronization, named by a
    hash): the raw client and the default store list the same keys and count them alike."""
    sim, real = _compare(script_zygote, ["groups"], 3)
    keys = [line for line in real.ranks[0].output if line.startswith("0 keys")]
    assert keys and keys[0].startswith("0 keys 9 ") and "'default_pg/0//1//cpu//0/1'" in keys[0], real.source
    assert sim.ranks[0].output == real.ranks[0].output


@pytest.mark.real
def test_a_store_rank_0_hosts_at_master_port_plus_1_is_the_runs_own_on_both_sides(script_zygote):
    """NVIDIA's in-process restart and NeMo host a coordination store at MASTER_PORT + 1. The
    shown MASTER_PORT is torchrun's 29500 for every run, so each run gets a port of its own
    for it (`launch.near_ports`): the run works while 29501 is taken here (before, rank 0's
    bind failed "address already in use" whenever another run, or anything, held it)."""
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as taken:
        try:
            taken.bind(("0.0.0.0", TORCHRUN_PORT + 1))
            taken.listen(1)
        except OSError:
            pass  # (something else holds it: as good a test)
        sim, real = _compare(script_zygote, ["next_port"], 3)
    for rep in (sim, real):
        assert [r.output for r in rep.ranks] == [
            [f"{r} next True 4 ['r0', 'r1', 'r2']"] for r in range(3)], rep.source


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_each_client_is_a_connection_of_its_own_and_shows_torchs_classes(script_zygote, nproc):
    """An `add` on a value that is no number closes that client's connection only: the rank's
    default store and its other client go on (before, the simulator closed every store of the
    rank: the default store's next call raised "Broken pipe", real Gloo's answered). A client
    made without a world size counts TCPStore's own key from init on (before, the simulator
    counted it only once a counted client had called: one key fewer); a clone is a connection
    of its own, its timeout copied (before, the simulator's clone was the store itself, broken
    with it, its timeout shared); the classes say torch's
    names and module; a port given as a str is torch's TypeError (before, it was routed); the
    default store's timeout is torch's 30 minutes (before, the real side's was 5); the default
    store's base is a TCPStore showing MASTER_ADDR:MASTER_PORT, as on torchrun (before: the
    simulator's a `SimStore` without `host` or `port`, the real side's at the launcher's port)."""
    sim, real = _compare(script_zygote, ["apart"], nproc)
    gone = "0 own DistNetworkError Failed to recv, got 0 bytes"
    both = ["class TCPStore torch._C._distributed_c10d True PrefixStore torch.distributed.distributed_c10d",
            f"num_keys {nproc + 1} default's timeout 0:30:00", "default's base TCPStore True True True",
            "a str port: TypeError"]
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        assert [r.output for r in rep.ranks] == [
            [f"{r} {line}" for line in both] + ([gone, gone, "0 own DistNetworkError Broken pipe",
                                                 "0 default b'up' other b'no number'",
                                                 "0 clone TCPStore b'no number' 0:00:01 True"] if r == 0 else [])
            for r in range(nproc)], rep.source


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_an_own_client_of_the_port_rank_0_hosts_at_reaches_that_store_without_torchrun(script_zygote, nproc):
    """`mp.spawn` and env://: rank 0's init hosts the store at the script's MASTER_PORT, which
    both sides serve elsewhere; a client of that port made after init reaches it, as on plain
    torch (measured with `python own_store_spawn.py 3`: the same lines, 5 keys). Before, both
    sides timed out connecting to (127.0.0.1, 29512), alike."""
    sim, real = _compare(script_zygote, [str(nproc)], None, ROOT / "tests" / "scripts" / "own_store_spawn.py")
    for rep in (sim, real):
        assert sorted(line for r in rep.ranks for line in r.output) == sorted(
            [f"{r} got b\"rank 0's\" 29512 True" for r in range(nproc)] + [f"0 num_keys {nproc + 2}"]), rep.source


BIND_LOG = re.compile(r"^\[rank0\]:\[E\d{4} \d\d:\d\d:\d\d\.\d{9} " + re.escape(BIND_IGNORED.format(TORCHRUN_PORT)) + "$")


@pytest.mark.real
def test_an_own_server_at_master_port_logs_torchs_ignored_bind_on_both_sides(tmp_path):
    """Under torchrun, `TCPStore(MASTER_ADDR, MASTER_PORT, is_master=True)` after init logs on
    rank 0's stderr (measured, torch 2.13): `[rank0]:[E1125 00:31:30.021155253 TCPStore.cpp:277]
    [c10d] The server socket on <MASTER_PORT> has failed to bind. TORCHELASTIC_USE_AGENT_STORE is
    enabled so ignoring the error.` (without `[rank0]:` before init). Before, neither side printed
    it: the routed client never binds. One line a side, rank 0's only."""
    res = subprocess.run([sys.executable, "-m", "simdist", "compare", str(SCRIPT), "--nproc-per-node", "3", "--json",
                          "--", "master"], capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert json.loads(res.stdout)["agree"], res.stdout
    assert len([line for line in res.stderr.splitlines() if BIND_LOG.match(line)]) == 2, res.stderr
    assert res.stderr.count("has failed to bind") == 2, res.stderr
