"""The `simdist_script` fixture, as a user's own test suite uses it (pytest's `pytester`).

A user's test file runs examples/ scripts (the DataLoader training script without Join,
which hangs when a rank gets fewer batches, and with Join, which completes) through the
fixture: `check`, `run`, `compare` with real Gloo and `fuzz`, under pytest-xdist (`-n 2`)
with `--junitxml`. The failures must read as simdist's explanation (the rank, the
collective, the user's line, the hint) in pytest's output and in the XML; no process may
outlive the session, also when pytest is interrupted (Ctrl-C) in the middle of a run."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import uuid
import xml.etree.ElementTree as ET

import pytest
import torch.distributed

import simdist.check.classify
import simdist.compare
import simdist.fuzz.scripts
import simdist.script.api
from simdist.errors import ScriptError
from simdist.procs import processes_with_env
from simdist.pytest_scripts import ForkServers, ScriptRunner

from .conftest import EXAMPLES, ROOT, TEST_TAG, descendants, line_of

pytest_plugins = ["pytester"]
# loaded before pytester's in-process runs, which unload whatever they import first: NumPy
# (under the engine) and torch (imported lazily by the runner's store) cannot be loaded twice
# in one process, so a test after such a run that is the first to need them would fail
PRELOADED = (simdist.check.classify, simdist.compare, simdist.fuzz.scripts, simdist.script.api, torch.distributed)
pytestmark = pytest.mark.real

NO_JOIN, JOIN = EXAMPLES / "fuzz_ddp_dataloader_no_join.py", EXAMPLES / "fuzz_ddp_dataloader_join.py"

USER_TESTS = f'''
import pytest
import torch.distributed

NO_JOIN, JOIN = {str(NO_JOIN)!r}, {str(JOIN)!r}


def test_uneven_batches_with_join_complete(simdist_script):
    report = simdist_script.check(JOIN, nproc_per_node=2, batches="2,3")
    assert [r.inputs_processed for r in report.ranks] == [2, 3]


def test_uneven_batches_without_join(simdist_script):
    simdist_script.check(NO_JOIN, nproc_per_node=2, batches="2,3")


def test_the_report_itself(simdist_script):
    report = simdist_script.run(NO_JOIN, ["--epochs", "1"], nproc_per_node=2, batches=[2, 3])
    assert report.outcome == "hang" and report.ranks[1].blocked_in.op == "all_reduce"


def test_simulator_and_real_gloo_agree(simdist_script):
    simdist_script.assert_ok(simdist_script.compare(JOIN, nproc_per_node=2, batches="1,2"))


def test_fuzz_uneven_batches(simdist_script):
    res = simdist_script.fuzz(NO_JOIN, nproc_per_node_range=(2, 2), batches_range=(1, 2), budget=4, seed=1)
    simdist_script.assert_ok(res)
'''


class SessionForkServers:
    """A plugin for an in-process pytester run: its `simdist_fork_servers` are this session's
    (`script_zygote`), so the user's suite forks its ranks at once, as a second test module of
    one session would (an override of the fixture, as a user's conftest may write it)."""

    def __init__(self, script_zygote, tmp_path):
        zygotes = {(mode, 8): script_zygote(mode) for mode in ("sim", "gloo")}
        self.servers = ForkServers(tmp_path / "ranks.log", zygotes)

    @pytest.fixture(scope="session")
    def simdist_fork_servers(self):
        return self.servers


EXPLANATION = ["check failed: hang", "ranks [1] wait in it, ranks [0] never issued it",
               "rank 1 is blocked in #8 all_reduce[161] float32 group=WORLD (ddp.backward.bucket_allreduce) "
               f"at fuzz_ddp_dataloader_no_join.py:{line_of(NO_JOIN, 'loss.backward()', after='for xb, yb in')} "
               "in main: loss.backward()",
               "hint (a rank finished while others wait)", "wrap the loop in Join([model, ...])"]


def test_a_users_suite_reads_as_simdist_explains(pytester, script_zygote, tmp_path):
    pytester.makepyfile(test_train=USER_TESTS)
    xml = tmp_path / "junit.xml"
    shared = SessionForkServers(script_zygote, tmp_path)
    res = pytester.runpytest("-p", "no:cacheprovider", f"--junitxml={xml}", plugins=[shared])
    res.assert_outcomes(passed=3, failed=2)
    out = res.stdout.str()
    # the hang's explanation: which rank waits in which collective, at which line, and why
    assert all(text in out for text in EXPLANATION), out
    # the search's counterexample, shrunk, with the commands that replay it
    assert "hang/hang: 2 ranks, batches per rank 1,2" in out and "replay in the simulator: simdist run" in out, out
    # the failure points at the user's line; simdist's own frames are hidden
    assert ">       simdist_script.check(NO_JOIN" in out and "pytest_scripts.py:" not in out, out
    cases = {c.get("name"): c.find("failure") for c in ET.parse(xml).getroot().iter("testcase")}
    assert {n for n, f in cases.items() if f is not None} == {"test_uneven_batches_without_join",
                                                              "test_fuzz_uneven_batches"}
    failure = cases["test_uneven_batches_without_join"]
    assert all(text in failure.text for text in EXPLANATION)  # the whole explanation
    assert all(text in failure.get("message") for text in EXPLANATION[:2])  # its first lines (pytest cuts it)
    assert all(descendants(z.pid) == [] for z in shared.servers.servers.values())  # every rank ended


def test_under_xdist_each_worker_has_its_fork_servers_and_junit_xml_the_explanation(pytester, tmp_path):
    pytester.makepyfile(test_train=USER_TESTS)
    xml = tmp_path / "junit.xml"
    res = pytester.runpytest("-n", "2", "-p", "no:cacheprovider", f"--junitxml={xml}", "-k", "complete or without_join")
    res.assert_outcomes(passed=1, failed=1)
    assert all(text in res.stdout.str() for text in EXPLANATION), res.stdout.str()
    (failure,) = [f for c in ET.parse(xml).getroot().iter("testcase") if (f := c.find("failure")) is not None]
    assert all(text in failure.text for text in EXPLANATION)
    assert descendants(os.getpid()) == []  # the workers, their fork servers and ranks all ended


@pytest.mark.slow
def test_the_documented_worked_example(pytester, script_zygote, tmp_path):
    """docs/testing.md's test_train.py for a user's script (parametrised caps, a search at
    2-4 ranks, agreement with real Gloo, the hang without Join), as a user runs it."""
    block = re.search(r"<!-- script example: .*? -->\n```python\n(.*?)```", (ROOT / "docs" / "testing.md").read_text(), re.S)
    assert block is not None
    pytester.makepyfile(test_train=block.group(1))
    (pytester.path / "examples").symlink_to(EXAMPLES)
    res = pytester.runpytest("-p", "no:cacheprovider", plugins=[SessionForkServers(script_zygote, tmp_path)])
    res.assert_outcomes(passed=6)


WAITS = '''
import sys
import time
import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    open(sys.argv[1], "w").close()  # the ranks are up
    end = time.monotonic() + 600
    while time.monotonic() < end:  # working: the simulator waits (up to the watchdog's timeout); a
        pass                       # sleep would be a timed wait it ends at once (`rank.timedwait`)
dist.barrier()
'''


def test_ctrl_c_in_the_middle_of_a_run_ends_every_process(pytester, tmp_path):
    """pytest interrupted while a run waits for a rank: the run's ranks, the session's fork
    server and pytest itself are gone within seconds."""
    (tmp_path / "train.py").write_text(WAITS)
    up = tmp_path / "up"
    pytester.makepyfile(test_wait=f'''
def test_run(simdist_script):
    simdist_script.run({str(tmp_path / "train.py")!r}, [{str(up)!r}], nproc_per_node=2, timeout_s=300)
''')
    tag = uuid.uuid4().hex
    p = subprocess.Popen([sys.executable, "-m", "pytest", "-p", "no:cacheprovider", "-q"], cwd=pytester.path,
                         env={**os.environ, TEST_TAG: tag}, stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 120
        while not up.exists():
            assert p.poll() is None and time.monotonic() < deadline, p.communicate()[0]
            time.sleep(0.1)
        assert len(processes_with_env(TEST_TAG, tag)) >= 4  # pytest, the fork server, two ranks
        p.send_signal(signal.SIGINT)
        out = p.communicate(timeout=60)[0].decode()
    finally:
        p.kill()
    assert p.returncode == 2 and "KeyboardInterrupt" in out, out
    deadline = time.monotonic() + 10
    while processes_with_env(TEST_TAG, tag) and time.monotonic() < deadline:
        time.sleep(0.1)
    assert processes_with_env(TEST_TAG, tag) == []


def test_the_watchdog_ends_a_run_that_waits_for_a_rank_and_its_ranks(script_zygote, tmp_path):
    """`timeout_s`: a rank that never communicates again (working) ends the run after that
    long, with every rank's process."""
    (tmp_path / "train.py").write_text(WAITS)
    servers = SessionForkServers(script_zygote, tmp_path).servers
    report = ScriptRunner(servers, tmp_path).run(tmp_path / "train.py", [str(tmp_path / "up")], nproc_per_node=2,
                                                 timeout_s=1)
    assert report.outcome == "hang" and report.notes[0].startswith("rank 0 is still running at train.py:"), report.notes
    assert report.ranks[1].blocked_in.op == "barrier"
    assert descendants(servers.get("sim", 8).pid) == []


@pytest.mark.parametrize("kw, text", [
    (dict(nproc_per_node_range=(3, 2)), r"nproc_per_node_range: expected \(LO, HI\) with 1 <= LO <= HI, got \(3, 2\)"),
    (dict(batches_range=(-1, 2)), r"batches_range: expected \(LO, HI\) with 0 <= LO <= HI"),
    (dict(backend="mpi"), r"backend: must be one of gloo, nccl, got 'mpi'"),
])
def test_bad_fuzz_arguments_name_the_argument_before_any_process_starts(tmp_path, kw, text):
    runner = ScriptRunner(ForkServers(tmp_path / "log"), tmp_path)
    try:
        with pytest.raises(ScriptError, match=text):
            runner.fuzz(JOIN, **kw)
        with pytest.raises(ScriptError, match="script: .*nope.py does not exist"):
            runner.run(tmp_path / "nope.py", nproc_per_node=2)
        with pytest.raises(ScriptError, match=r"args: the script's arguments as a list, e.g. \['--epochs', '2'\]"):
            runner.run(JOIN, "--epochs 2", nproc_per_node=2)
        with pytest.raises(ScriptError, match="batches: 3 caps given"):
            runner.compare(JOIN, nproc_per_node=2, batches="1,2,3")
        assert runner.fork_servers.servers == {}  # none was started
    finally:
        runner.fork_servers.close()


def test_the_fixture_runs_a_script_on_a_cpu_only_node(tmp_path):
    """`gpus_per_node=0`: the fixture's runs are on a CPU-only node (a fork server of their
    own, keyed by the GPU count), so the script takes its CPU path on both sides; a bad count
    names the argument before any fork server starts."""
    runner = ScriptRunner(ForkServers(tmp_path / "log"), tmp_path)
    script = ROOT / "tests" / "scripts" / "cuda_or_cpu.py"
    try:
        with pytest.raises(ScriptError, match=r"gpus_per_node: must be a whole number of GPUs from 0 .* got -1"):
            runner.run(script, nproc_per_node=2, gpus_per_node=-1)
        assert runner.fork_servers.servers == {}
        compared = runner.assert_ok(runner.compare(script, nproc_per_node=2, gpus_per_node=0))
        assert compared.agree and set(runner.fork_servers.servers) == {("sim", 0), ("gloo", 0)}
        report = runner.run(script, nproc_per_node=2)  # the default node: 8 GPUs, the GPU path
        assert any("cuda available True, devices 8, backend nccl" in line for line in report.ranks[0].output)
    finally:
        runner.fork_servers.close()
