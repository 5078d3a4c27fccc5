"""Bad input and ranks that fail: one-line errors, reports that say what happened and where,
and no process left behind (after an error, a hang, Ctrl-C, or SIGKILL of simdist itself)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import textwrap
import time
import uuid
from pathlib import Path

import pytest

from simdist.errors import ScriptError
from simdist.procs import processes_with_env
from simdist.script import run_script
from simdist.script.agent import terminated_words
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT, TEST_TAG, descendants, one_line_error, run_cli

pytestmark = pytest.mark.real

HEAD = """
import os, sys, time
import torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
"""


def _script(tmp_path: Path, body: str, name: str = "train.py") -> Path:
    p = tmp_path / name
    p.write_text(HEAD + textwrap.dedent(body))
    return p


@pytest.fixture
def run(script_zygote):
    """`run(path, **kw)`: the script on 2 simulated ranks forked by the session's zygote
    (`script_zygote`; how a rank ends is reported the same either way, test_script_fuzz.py);
    none of its processes outlives the run. The CLI's plain launch of failing ranks:
    test_script_commands.py."""
    def go(path: Path, **kw):
        run_id, z = new_run_id(), script_zygote("sim")
        try:
            return run_script(path, nproc_per_node=2, timeout_s=kw.pop("timeout_s", 120), run_id=run_id, zygote=z,
                              **kw)
        finally:  # also when the run raised (bad input found once the ranks ran)
            assert tagged_processes(run_id) == [] and descendants(z.pid) == []

    return go


def _line(path: Path, text: str) -> int:
    return next(i for i, line in enumerate(path.read_text().splitlines(), 1) if text in line)


def test_a_rank_that_raises(tmp_path, run):
    p = _script(tmp_path, """
        if rank == 1:
            raise ValueError("bad batch")
        dist.all_reduce(torch.ones(1))
    """)
    rep = run(p)
    assert rep.outcome == "error"
    r0, r1 = rep.ranks
    assert r1.status == "error" and (r1.error.type, r1.error.message) == ("ValueError", "bad batch")
    assert r1.location.line == _line(p, "raise ValueError") and r1.exit == "raised ValueError"
    assert r0.status == "error" and r0.error.category == "peer_lost"  # Gloo: the peer's exit fails the all_reduce
    assert r0.location.line == _line(p, "dist.all_reduce")


def test_a_rank_that_calls_os_exit(tmp_path, run):
    p = _script(tmp_path, """
        if rank == 1:
            os._exit(3)
        dist.all_reduce(torch.ones(1))
    """)
    rep = run(p, backend="nccl")
    r0, r1 = rep.ranks
    assert r1.status == "error" and r1.exit == "os._exit(3)" and r1.location.line == _line(p, "os._exit(3)")
    assert (r1.error.type, r1.error.message) == ("os._exit", "exit code 3")
    # nccl: nobody tells rank 0, it would hang; torchrun-style, torchrun's agent SIGTERMs it one
    # monitor interval after rank 1's exit, where it waits (`simdist.script.agent`)
    assert rep.outcome == "error" and (r0.status, r0.exit) == ("error", terminated_words(1))
    assert r0.location.line == _line(p, "dist.all_reduce")


def test_sleeping_and_computing_ranks_are_not_hung(tmp_path, run):
    p = _script(tmp_path, """
        if rank == 0:
            time.sleep(1.0)
        else:
            x = torch.randn(200, 200)
            t0 = time.time()
            while time.time() - t0 < 1.0:
                x = (x @ x).tanh()
        t = torch.ones(1)
        dist.all_reduce(t)
        print(int(t.item()))
    """)
    rep = run(p)
    assert rep.outcome == "completed" and [r.output for r in rep.ranks] == [["2"], ["2"]]


def test_an_operation_the_backend_cannot_model_is_named(tmp_path, run):
    p = _script(tmp_path, """
        t = torch.zeros(3, dtype=torch.uint16)
        dist.all_reduce(t)
    """)
    with pytest.raises(ScriptError, match=r"a tensor of dtype uint16 is not supported by the simulated backend "
                                          r"\(rank 0 at train.py:\d+ in <module>: dist.all_reduce\(t\)\)"):
        run(p)


@pytest.mark.parametrize("args", [[], ["--after-group"]], ids=["no-group", "after-group"])
def test_rpc_is_refused_naming_init_rpc_and_the_lowest_rank(args, run):
    """`init_rpc` would rendezvous for real over TCP and run remote calls outside the
    simulation: refused as bad input, from a process that is no rank as from one that
    all-reduced first, naming the RPC worker of the lowest rank (each process says so; the
    first to tell must not decide, or two runs would differ)."""
    p = ROOT / "tests" / "scripts" / "rpc_refused.py"
    line = _line(p, "rpc.init_rpc(")
    with pytest.raises(ScriptError) as e:
        run(p, args=args)
    assert str(e.value) == ("script: torch.distributed.rpc.init_rpc (RPC) is not supported by the simulated backend "
                            f"(worker 'worker0' at rpc_refused.py:{line} in <module>: "
                            'rpc.init_rpc(f"worker{rank}", rank=rank, world_size=world))')


def test_a_rank_spinning_without_communicating_is_caught_by_the_watchdog(tmp_path, run):
    p = _script(tmp_path, """
        if rank == 0:
            while True:
                pass
        dist.barrier()
    """)
    rep = run(p, timeout_s=6)
    assert rep.outcome == "hang" and [r.status for r in rep.ranks] == ["hang", "hang"]
    assert rep.ranks[1].waiting_in.op == "barrier"
    assert any("watchdog" in n for n in rep.notes)


def test_bad_input_is_one_line_and_exit_2(tmp_path):
    """(Each bad script through the CLI, with no process left: test_script_commands.py.)"""
    never = tmp_path / "never.py"
    never.write_text("print('no process group here')\n")
    line = one_line_error(run_cli("run", "scenarios/ddp_join_uneven.toml", "--nproc-per-node", "2"))
    assert "only for a script" in line
    with pytest.raises(ScriptError, match="never initialised a process group"):
        run_script(never, stdout=subprocess.DEVNULL)


def _start_cli(tmp_path: Path) -> tuple[subprocess.Popen, list[int], str]:
    """simdist running a 2-rank script (rank 0 computing, rank 1 waiting on it: a sleep would be
    a timed wait the simulator ends at once, `rank.timedwait`), the ranks' pids and the tag
    every process of the run carries in its environment."""
    pids = tmp_path / "pids"
    pids.mkdir()
    p = _script(tmp_path, f"""
        open(os.path.join({str(pids)!r}, str(os.getpid())), "w").close()
        if rank == 0:
            end = time.monotonic() + 600
            while time.monotonic() < end:
                pass
        dist.all_reduce(torch.ones(1))
    """)
    tag = uuid.uuid4().hex
    proc = subprocess.Popen([sys.executable, "-m", "simdist", "run", str(p), "--nproc-per-node", "2"], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                            env={**os.environ, TEST_TAG: tag})
    deadline = time.time() + 120
    while len(os.listdir(pids)) < 2 and time.time() < deadline:
        time.sleep(0.1)
    time.sleep(0.5)  # both ranks are in the loop now: rank 0 computing, rank 1 waiting
    return proc, [int(x) for x in os.listdir(pids)], tag


def _gone(pids: list[int], within: float) -> bool:
    deadline = time.time() + within
    while time.time() < deadline:
        alive = []
        for pid in pids:
            try:
                with open(f"/proc/{pid}/stat", "rb") as fh:
                    if fh.read().rsplit(b")", 1)[1].split()[0] not in (b"Z", b"X"):
                        alive.append(pid)
            except OSError:
                pass
        if not alive:
            return True
        time.sleep(0.1)
    return False


def test_ctrl_c_ends_every_process(tmp_path):
    proc, pids, tag = _start_cli(tmp_path)
    assert len(pids) == 2
    proc.send_signal(signal.SIGINT)
    stdout, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 130, stdout + stderr
    # the run as it stood (`api.execute`'s `status`): rank 1 blocked in its all_reduce; the ranks print nothing
    assert "interrupted (Ctrl-C)" in stdout and "rank 1" in stdout, stdout
    assert stderr.strip() == "", stderr
    assert _gone(pids, 5)
    assert processes_with_env(TEST_TAG, tag) == []  # nor anything else of the run


def test_sigkill_of_simdist_ends_every_process(tmp_path):
    proc, pids, tag = _start_cli(tmp_path)
    assert len(pids) == 2
    proc.kill()
    proc.wait(timeout=10)
    assert _gone(pids, 5)
    deadline = time.time() + 5
    while processes_with_env(TEST_TAG, tag) and time.time() < deadline:
        time.sleep(0.1)
    assert processes_with_env(TEST_TAG, tag) == []

