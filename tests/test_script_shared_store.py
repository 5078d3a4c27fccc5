"""A script's own exchange through the default store (`c10d._get_default_store()`): on real
Gloo under torchrun every rank's store reaches one server; the simulated ranks share one the
coordinator holds on the simulated clock (`simdist.script.keystore`, `rank.simstore`). Each
script runs on both sides (`tests/scripts/store_exchange.py`); before, each simulated rank had
a HashStore of its own: rank 1's get waited until its timeout or the watchdog."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from simdist.script.keystore import stoll, wait_timeout
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT, line_of

SCRIPT = ROOT / "tests" / "scripts" / "store_exchange.py"


def _compare(zygote, args: list[str], nproc: int, timeout_s: float = 90):
    run_id = new_run_id()
    both = compare_script(SCRIPT, args, nproc_per_node=nproc, backend="gloo", run_id=run_id, measure_compute=False,
                          zygotes=zygote, timeout_s=timeout_s, hang_after_s=0.3)
    assert tagged_processes(run_id) == []
    sim, real = both.sim.report, both.real.report
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    return sim, real


def _lines(rep) -> list[list[str]]:
    return [sorted(r.output) for r in rep.ranks]


@pytest.mark.real
@pytest.mark.parametrize(("mode", "nproc", "expect"), [
    ("set_get", 2, lambda r, w: [f"{r} got b'from rank 0 of {w}'"]),
    ("set_get", 3, lambda r, w: [f"{r} got b'from rank 0 of {w}'"]),
    ("set_get", 4, lambda r, w: [f"{r} got b'from rank 0 of {w}'"]),
    ("add", 3, lambda r, w: [f"{r} reads {w * (w + 1) // 2} = {w * (w + 1) // 2}"]),
    ("add", 4, lambda r, w: [f"{r} reads {w * (w + 1) // 2} = {w * (w + 1) // 2}"]),
    ("leader", 3, lambda r, w: [f"{r} leaders: 1 agree: True"]),
    ("leader", 4, lambda r, w: [f"{r} leaders: 1 agree: True"]),
    ("wait_many", 2, lambda r, w: [f"{r} sees [b'v0', b'v{w - 1}']"]),
    ("wait_many", 4, lambda r, w: [f"{r} sees [b'v0', b'v{w - 1}']"]),
])
def test_what_one_rank_writes_its_peers_read_on_both_sides(script_zygote, mode, nproc, expect):
    sim, real = _compare(script_zygote, [mode], nproc)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        assert _lines(rep) == [expect(r, nproc) for r in range(nproc)], rep.source


@pytest.mark.real
def test_tcpstores_rules_for_compare_set_add_delete_check_append(script_zygote):
    sim, real = _compare(script_zygote, ["semantics"], 2)
    assert sim.ranks[0].output == real.ranks[0].output == [
        "cs missing, expected empty: b'new' b'new'",
        "cs missing, expected x: b'x' False",  # the expected value back, nothing set
        "cs match: b'y' mismatch: b'y'",
        "add on '7 ': 8 add new: -3",  # stoll's reading
        "delete: True False check: False True",
        "append: b'1\\x00\\xff' multi: [b'1', b'2']"]


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_a_get_past_the_stores_timeout_raises_torchs_words_at_T_on_the_simulated_clock(script_zygote, nproc):
    sim, real = _compare(script_zygote, ["timeout", "2"], nproc)
    last = nproc - 1
    words = wait_timeout(2.0, ["default_pg/0//never"])
    for rep in (sim, real):
        err = rep.ranks[last].error
        assert rep.ranks[last].status == "error" and err is not None, rep.source
        assert (err.type, rep.ranks[last].location.line) == (words[0], line_of(SCRIPT, "its timeout ends it")), rep.source
    assert sim.ranks[last].error.message == words[1]
    assert real.ranks[last].error.message == words[1]  # (the real side's keys are torchrun's: `default_pg/...`)
    assert sim.ranks[last].time == pytest.approx(2.0, abs=0.05)
    assert real.timings["wall_s"] >= 2.0  # (the real side measures the run, not each rank)


@pytest.mark.real
@pytest.mark.parametrize(("store_s", "gloo_s", "lines"), [
    # the store's wait ends first: rank 0 raises at 1 s and joins the all_reduce, which completes
    ("1", "3", [["0 store wait ended: DistStoreError", "0 then all_reduce done"], ["1 all_reduce done 3.0"],
                ["2 all_reduce done 3.0"]]),
    # the all_reduce times out first: rank 1 then sets the key rank 0 waits for
    ("3", "1", [["0 got b\"set after the all_reduce's timeout\""], ["1 all_reduce ended: RuntimeError"],
                ["2 all_reduce ended: RuntimeError"]]),
])
def test_a_store_timeout_and_a_gloo_timeout_fire_in_simulated_time_order(script_zygote, store_s, gloo_s, lines):
    sim, real = _compare(script_zygote, ["vs_gloo", store_s, gloo_s], 3)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * 3, rep.source
        assert [r.output for r in rep.ranks] == lines, rep.source
    first = min(float(store_s), float(gloo_s))
    assert sim.ranks[0].time == pytest.approx(first, abs=0.05)


@pytest.mark.real
def test_a_get_of_a_key_nobody_sets_is_a_hang_with_its_words(script_zygote):
    """Without a timeout of its own the wait lasts the store's timeout (30 min by default):
    the simulator proves the hang at once; real Gloo's run is ended by the watchdog."""
    sim, real = _compare(script_zygote, ["never"], 2, timeout_s=15)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["hang", "hang"], rep.source
    at = line_of(SCRIPT, 'store.get("never")')
    for r in (0, 1):
        assert f"rank {r} is waiting in store.get at store_exchange.py:{at}" in "\n".join(sim.notes)
        assert (f"store.get: on real torch rank {r}'s wait ends after its store's timeout (1800 s): DistStoreError: "
                f"{wait_timeout(1800.0, ['default_pg/0//never'])[1]}") in sim.notes


def test_stoll_reads_what_tcpstores_add_reads():
    assert [stoll(v) for v in (b"7 ", b" -3x", b"+4", b"1.5", b"x", b"", b"9" * 30)] == [7, -3, 4, 1, None, None, None]


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 4])
def test_torch_elastics_synchronize_and_barrier_over_a_prefix_of_the_default_store(script_zygote, nproc):
    sim, real = _compare(script_zygote, ["elastic"], nproc)
    every = [f"r{r}".encode() for r in range(nproc)]
    for rep in (sim, real):
        assert [r.output for r in rep.ranks] == [[f"{r} synchronized {every}", f"{r} passed the barrier"]
                                                 for r in range(nproc)], rep.source


@pytest.mark.real
def test_an_elastic_barrier_a_rank_never_enters_names_it_after_the_waits_timeouts(script_zygote):
    """Ranks 0 and 1 time out at 2 s; rank 0 then waits 1 s (trace_timeout) for rank 2's
    trace key, names it missing and opens the gate rank 1 waits at: both end at 3 s."""
    sim, real = _compare(script_zygote, ["elastic_missing", "2"], 3)
    lines = [["0 barrier: Timed out waiting on barrier on rank 0, for key prefix: bar/ (world_size=3, "
              "missing_ranks=[2], timeout=2.0)"],
             ["1 barrier: Timed out waiting on barrier on rank 1, for key prefix: bar/ (world_size=3, "
              "missing_ranks=[[<check rank 0 (0) for missing rank info>]], timeout=2.0)"], []]
    for rep in (sim, real):
        assert [r.output for r in rep.ranks] == lines, rep.source
    assert [r.time for r in sim.ranks[:2]] == [pytest.approx(3.0, abs=0.05)] * 2
    assert real.timings["wall_s"] >= 3.0


@pytest.mark.real
def test_an_add_on_a_value_that_is_no_number_closes_the_ranks_store_connection(script_zygote):
    sim, real = _compare(script_zygote, ["add_text"], 2)
    gone = "0 DistNetworkError Failed to recv, got 0 bytes. Connection was likely closed. Did the remote server " \
           "shutdown or crash?"
    for rep in (sim, real):
        assert rep.ranks[0].output == [gone, gone, "0 DistNetworkError Broken pipe"], rep.source


@pytest.mark.real
def test_a_scripts_own_client_of_torchruns_port_reaches_the_shared_store_on_both_sides(script_zygote):
    """torchrun's agent serves MASTER_PORT; a script's own `TCPStore(MASTER_ADDR, MASTER_PORT,
    is_master=False)` is routed there on both sides (`rank.ownstore`; more in
    tests/test_script_own_store.py). Before, both sides timed out connecting, the same way."""
    sim, real = _compare(script_zygote, ["own_client"], 2)
    for rep in (sim, real):
        assert [r.output for r in rep.ranks] == [[f"{r} own client got b\"rank 0's\""] for r in range(2)], rep.source


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_store_calls_take_effect_in_simulated_time_not_in_the_order_they_reach_the_coordinator(script_zygote, nproc):
    """Rank 0's get times out at 1 s, then it sets a key and adds; rank 1 sleeps 2 s, then checks
    that key and adds. Rank 1's calls reach the coordinator while rank 0's timeout is still to be
    proven (rank 1 was not blocked): answered on arrival, rank 1 read the store of before 1 s
    ("checks False adds 1", rank 0 "adds 2"); held until nothing can precede them, both sides agree."""
    sim, real = _compare(script_zygote, ["late", "1", "2"], nproc)
    for rep in (sim, real):
        assert [r.output for r in rep.ranks][:2] == [["0 adds 1"], ["1 checks True adds 2"]], rep.source
    assert sim.ranks[1].time == pytest.approx(2.0, abs=0.05)


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, 3])
def test_the_store_a_rank_kept_works_after_destroy_process_group_on_both_sides(script_zygote, nproc):
    """The `PrefixStore` a script kept is a client of the agent's server still: rank 0 sets a key
    after every rank destroyed its group, the others get it. Before, the simulator dropped the
    calls of a rank that left its generation and the run ended by the watchdog."""
    sim, real = _compare(script_zygote, ["after_destroy"], nproc)
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed"] * nproc, rep.source
        assert [r.output for r in rep.ranks] == [[]] + [[f"{r} got b'set after destroy'"] for r in range(1, nproc)], \
            rep.source
