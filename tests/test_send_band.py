"""A send whose receiver posted its receive and left (`tests/scripts/send_to_leaver.py`): on real
Gloo it completes when the kernel's socket buffers take it whole (`simdist.socket_buffers`),
and beyond that either completes or times out by how long the receiver lived to read (a race:
`simdist.races.SendBandRace`); a send to a receiver that left without posting one loses it;
one to a receiver that stays up and never receives times out. Real Gloo processes beside the
simulated ones, world size 2; the band's evidence is in `simdist.races`' docstring."""

from __future__ import annotations

import functools
import json
import socket

import pytest

from simdist.cli.reports import Compared
from simdist.races import SendBandRace
from simdist.report import Report
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from simdist.socket_buffers import tcp_setting, whole_write
from tests.conftest import ROOT, descendants

SCRIPT = ROOT / "tests" / "scripts" / "send_to_leaver.py"
SAVED = ROOT / "tests" / "data" / "races"


def _saved() -> tuple[Report, Report]:
    """`python bench/race_tally.py tests/scripts/send_to_leaver.py --nproc 2 --keep DIR -- 8388608
    posted kill`: the simulated run and a real one whose 8 MB send timed out."""
    return tuple(Report.from_dict(json.loads((SAVED / f"send_band_8m_{n}.json").read_text())) for n in ("sim", "real"))


@functools.cache
def young_capacity() -> int:
    """The bytes a fresh loopback TCP connection takes from a non-blocking sender before it
    would block, with nobody reading: the least a Gloo pair's socket takes at once (about
    3.9 MB on a kernel with tcp_wmem max 4 MB). A measuring instrument of these tests: the
    simulator needs only `whole_write`."""
    with socket.create_server(("127.0.0.1", 0)) as server:
        with socket.create_connection(server.getsockname()) as tx:
            rx, _ = server.accept()
            with rx:
                tx.setblocking(False)
                chunk, total = bytes(1 << 20), 0
                while True:
                    try:
                        total += tx.send(chunk)
                    except BlockingIOError:
                        return total


def test_what_the_race_takes_as_written_whole_a_fresh_connection_takes_at_once():
    """`whole_write`, the band's floor, is no more than what a fresh loopback connection takes
    at once, and that no more than the two buffers' maxima (`net.ipv4.tcp_wmem` + `tcp_rmem`);
    measured and read, not constants."""
    wmax, rmax = tcp_setting("tcp_wmem", 2), tcp_setting("tcp_rmem", 2)
    got = young_capacity()
    assert 0 < whole_write() <= got and (wmax is None or rmax is None or got <= wmax + rmax)


def test_a_timed_out_send_longer_than_the_buffers_to_a_receiver_that_left_is_a_send_band_race():
    sim, real = _saved()
    assert sim.ranks[0].status == "completed" and real.ranks[0].error.category == "timeout"
    got = Compared.of(sim, real)
    assert got.verdict == "race" and got.races == [SendBandRace(0, 1, 8 * 2**20, whole_write())]
    assert got.races[0].describe().startswith("rank 0: send-band race, not a model difference: its send of "
                                              "8,388,608 bytes to rank 1")


def test_below_the_kernels_capacity_a_timed_out_send_is_a_difference(monkeypatch):
    """The same runs on a kernel whose default send buffer is 9 MB: the 8 MB send was written
    whole, so real Gloo completes it whatever the receiver does: a timeout there is the
    model's fault. And a receiver that did something after its receive did not leave with it."""
    import simdist.races as races

    monkeypatch.setattr(races, "whole_write", lambda: 9 * 2**20)
    assert Compared.of(*_saved()).verdict == "differ"
    monkeypatch.undo()
    sim, real = _saved()
    for report in (sim, real):
        report.ranks[1].trace.append(report.ranks[0].trace[0])
    assert Compared.of(sim, real).verdict == "differ"


def test_a_receiver_that_lived_on_after_its_receive_makes_a_timed_out_send_a_difference():
    """The receiver posted its receive and ended with it, but 10 s later on the simulated
    clocks (it computed): its Gloo thread read the send meanwhile, whatever its size, so real
    Gloo completes it; a timeout there is no race of its teardown."""
    sim, real = _saved()
    sim.ranks[1].time = sim.ranks[1].trace[-1].t_issue + 10.0
    assert Compared.of(sim, real).verdict == "differ"


def _both(args: list[str], zygote, tmp_path) -> tuple[Report, Compared]:
    """The simulated run of `send_to_leaver.py ARGS` and its comparison with a real one."""
    run_id = new_run_id()
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        both = compare_script(SCRIPT, args, nproc_per_node=2, backend="gloo", timeout_s=120, run_id=run_id,
                              measure_compute=False, zygotes=zygote)
    assert tagged_processes(run_id) == [] and all(descendants(zygote(m).pid) == [] for m in ("sim", "gloo"))
    return both.sim.report, Compared.of(both.sim.report, both.real.report)


@pytest.mark.real
@pytest.mark.parametrize(("how", "want"), [("posted", "completed"), ("never", "peer_lost"), ("alive", "timeout")])
def test_a_send_within_the_buffers_agrees_with_real_gloo(how, want, script_zygote, tmp_path):
    """A send the kernel takes whole (its default send buffer): the posted receive's sender
    completes, as simulated, however soon the receiver is killed (measured: up to 3 MB
    completed 60 of 60 runs, exited or killed); a receiver that never posted fails it with its
    closure, one that stays up leaves it to its timeout."""
    sim, got = _both([str(whole_write()), how, "kill"], script_zygote, tmp_path)
    assert got.verdict == "agree", got.cmp.differences
    sender = sim.ranks[0]
    assert (sender.error.category if sender.error else sender.status) == want


@pytest.mark.real
def test_a_send_beyond_the_buffers_to_a_receiver_killed_at_once_is_a_race_never_a_difference(script_zygote,
                                                                                                  tmp_path):
    """Four times what the kernel takes at once, the receiver killed right after posting:
    mostly a timeout on real Gloo (7, 8, 12, 16 MB: 0 of 40 completed on this host once),
    which the comparison names as the race; a run that completes agrees."""
    sim, got = _both([str(4 * young_capacity()), "posted", "kill"], script_zygote, tmp_path)
    assert sim.ranks[0].status == "completed"
    assert got.verdict in ("agree", "race") and all(r.kind == "send_band" for r in got.races), got.cmp.differences
