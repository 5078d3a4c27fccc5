"""The real backend on real torch.distributed processes (Gloo, world sizes 2-3).

Every test runs actual worker processes, checks what they recorded, and checks that no
process it started is left behind. Scenarios live in tests/scenarios_real/.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simdist.errors import HostError, LimitError
from simdist.scenario import load_scenario, parse_scenario

from .conftest import descendants, listening_sockets

torch = pytest.importorskip("torch")
if not torch.distributed.is_available():  # pragma: no cover
    pytest.skip("torch.distributed is not available", allow_module_level=True)

from real_backend.launch import run_real  # noqa: E402

pytestmark = pytest.mark.real
HERE = Path(__file__).resolve().parent
REAL = HERE / "scenarios_real"
ROOT = HERE.parent


def _processes_mentioning(text: str) -> list[int]:
    """pids (other than ours) whose command line contains `text`."""
    out = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit() or int(d.name) == os.getpid():
            continue
        try:
            cmd = (d / "cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if text in cmd:
            out.append(int(d.name))
    return out


def _children() -> list[int]:
    """Live (non-zombie) children of this test process."""
    kids = []
    for d in Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            stat = (d / "stat").read_text()
        except OSError:
            continue
        fields = stat.rsplit(")", 1)[1].split()
        state, ppid = fields[0], int(fields[1])
        if ppid == os.getpid() and state != "Z":
            kids.append(int(d.name))
    return kids


def _run(name: str, tmp_path: Path, **kw):
    s = load_scenario(REAL / f"{name}.toml")
    wd = tmp_path / "wd"
    # Children that were alive before (another test's helper such as multiprocessing's
    # resource tracker) are not this run's to end.
    before = set(_children())
    t = time.monotonic()
    report = run_real(s, workdir=wd, **kw)
    wall = time.monotonic() - t
    assert _processes_mentioning(str(wd)) == [], "a worker outlived the run"
    assert set(_children()) - before == set(), "a child process outlived the run"
    return s, report, wall


def _check_expect(s, report) -> None:
    e = s.expect
    assert e is not None
    if e.outcome is not None:
        assert report.outcome == e.outcome
    if e.status is not None:
        assert [r.status for r in report.ranks] == e.status
    if e.inputs_processed is not None:
        assert [r.inputs_processed for r in report.ranks] == e.inputs_processed
    if e.collectives is not None:
        assert [len(r.trace) for r in report.ranks] == e.collectives
    for name, values in e.observed.items():
        assert [r.observed.get(name) for r in report.ranks] == values


def test_ddp_join_trace_labels_and_roots(tmp_path):
    s, report, _ = _run("ddp_join", tmp_path)
    _check_expect(s, report)
    assert report.source == "real" and report.world_size == 2
    r0, r1 = report.ranks
    for r in (r0, r1):
        assert [e.seq for e in r.trace] == list(range(1, 27))
        assert all(e.completed and e.group == "WORLD" and e.group_size == 2 for e in r.trace)
        assert r.error is None
    init = ["ddp.init.verify_params", "ddp.init.verify_params", "ddp.init.sync_module_states"]
    it0 = ["join.notify_join_context.heartbeat", "ddp.pre_forward.requires_grad_sync", "ddp.backward.bucket_allreduce"]
    it1 = it0[:1] + ["ddp.pre_forward.rebuild_buckets"] * 2 + it0[1:]
    shadow = ["join.exit.count_nonjoined", "ddp.join_hook.requires_grad_sync", "ddp.join_hook.bucket_allreduce"]
    exit_ = ["join.exit.count_nonjoined", "ddp.post_hook.find_common_rank", "ddp.post_hook.broadcast_final_model"]
    assert [e.origin for e in r0.trace] == init + it0 + it1 + it0 * 3 + shadow + exit_
    assert [e.origin for e in r1.trace] == init + it0 + it1 + it0 * 4 + exit_
    # FR's view of each collective, and what the recorder derives from the program.
    verify_ag, verify_bc, states = r0.trace[:3]
    assert (verify_ag.op, verify_ag.numel, verify_ag.dtype) == ("all_gather", 1, "int64")
    assert (verify_bc.op, verify_bc.numel, verify_bc.dtype, verify_bc.root) == ("broadcast", 4, "int64", 0)
    assert (states.op, states.numel, states.dtype, states.root, states.phase) == ("broadcast", 2, "float32", 0, "init")
    rebuild = [e for e in r0.trace if e.origin == "ddp.pre_forward.rebuild_buckets"]
    assert [(e.numel, e.dtype, e.root, e.iteration) for e in rebuild] == [(3, "int32", 0, 1), (1, "int32", 0, 1)]
    heartbeats = [e for e in r1.trace if e.origin == "join.notify_join_context.heartbeat"]
    assert [e.iteration for e in heartbeats] == list(range(6)) and all(e.async_op for e in heartbeats)
    common, final = r0.trace[-2:]
    assert (common.dtype, common.reduce_op, common.phase) == ("int64", "max", "join_exit")
    assert final.root == 1  # rank 1 joined last
    assert [e.phase for e in r0.trace[20:23]] == ["join_exit"] * 3


def test_counter_tutorial_values(tmp_path):
    s, report, _ = _run("counter", tmp_path)
    _check_expect(s, report)  # count 10/11, max_count 11/11
    for r in report.ranks:
        assert r.trace[-2].origin == "counter.post_hook.find_common_rank" and r.trace[-2].reduce_op == "max"
        assert r.trace[-1].origin == "counter.post_hook.broadcast_max_count" and r.trace[-1].root == 1
    assert [e.origin for e in report.ranks[0].trace[10:13]] == [
        "join.exit.count_nonjoined",
        "counter.main_hook.allreduce",
        "join.exit.count_nonjoined",
    ]


def test_hang_is_detected_with_the_blocked_collective(tmp_path):
    s, report, wall = _run("hang_stay", tmp_path)
    _check_expect(s, report)
    assert s.timeout_s == 3
    r0, r1 = report.ranks
    assert r0.blocked_in is None
    b = r1.blocked_in
    assert b is not None and (b.seq, b.op, b.origin, b.completed, b.iteration) == (
        3,
        "all_reduce",
        "user.step_sum",
        False,
        2,
    )
    assert r1.observed == {"sum": [2.0, 2.0]}
    assert any("watchdog fired" in n and "[1]" in n for n in report.notes)
    # The acceptance bound: the run, watchdog included, ends within timeout + 10 s of the hang.
    started = min(r.trace[0].t_issue for r in report.ranks)  # worker start-up (torch import) is not the hang
    assert wall - started < s.timeout_s + 10, f"wall {wall:.1f} s, startup {started:.1f} s"


def test_peer_that_exits_is_lost(tmp_path):
    s, report, _ = _run("peer_lost", tmp_path)
    _check_expect(s, report)
    r1 = report.ranks[1]
    assert r1.error is not None and r1.error.category == "peer_lost" and r1.error.type == "RuntimeError"
    assert "by peer" in r1.error.message
    assert r1.observed == {"sum": [1.0, 1.0]}  # value = rank: 0 + 1
    assert "rank 1: lost peer(s) [0]" in report.notes


def test_sigkill_of_one_rank_ends_the_run(tmp_path):
    _, report, _ = _run("sigkill", tmp_path, kill_at=(1, 3))
    r0, r1 = report.ranks
    assert report.outcome == "error"
    assert r1.status == "aborted" and r1.error is not None
    assert (r1.error.category, r1.error.message) == ("killed", "killed by SIGKILL")
    # From the rank's last progress note (polled): it had finished at least 3 iterations.
    assert 3 <= r1.inputs_processed <= r0.inputs_processed + 1
    assert r0.status == "error" and r0.error is not None and r0.error.category == "peer_lost"
    assert "rank 1: killed by SIGKILL" in report.notes


def test_gloo_abort_is_captured(tmp_path):
    s, report, _ = _run("gloo_abort", tmp_path)
    _check_expect(s, report)
    r0, r1 = report.ranks
    assert r1.error is not None and r1.error.category == "gloo_abort" and r1.error.type == "gloo::EnforceNotMet"
    assert "op.preamble.length <= op.nbytes. 8 vs 4" in r1.error.message
    # The terminate hook recorded the trace before the abort: the aborting collective never completed.
    assert [(e.op, e.dtype, e.completed) for e in r1.trace] == [("all_reduce", "float32", False)]
    assert r0.error is not None and r0.error.category == "peer_lost"
    assert [e.dtype for e in r0.trace] == ["int64", "int64"]


def test_every_raw_collective_group_and_p2p(tmp_path):
    s, report, _ = _run("collectives_mix", tmp_path)
    _check_expect(s, report)
    r0, r1, r2 = report.ranks
    want = {
        "ar": [3.0, 3.0],
        "bc": [2.0, 2.0],
        "ag": [[0, 1, 2]] * 2,
        "rs": [3.0, 3.0],
        "a2a": [[0.0, 1.0, 2.0]] * 2,
        "sc": [1.0, 1.0],
        "after": [-3.0],
    }
    for r in report.ranks:
        for k, v in want.items():
            assert r.observed[k] == v, (r.rank, k)
    assert r0.observed["ga"] == [[0.0, 1.0, 2.0]] * 2 and r1.observed["ga"] == [None, None]
    assert r0.observed["pair_max"] == [0.0, 1.0] and "pair_max" not in r2.observed
    assert r2.observed["p2p"] == [[7.0, 7.0]] * 2
    ops = [(e.op, e.numel, e.dtype, e.group, e.group_size) for e in r0.trace[:10]]
    assert ops == [
        ("all_reduce", 1, "float32", "WORLD", 3),
        ("broadcast", 1, "float32", "WORLD", 3),
        ("all_gather", 1, "int64", "WORLD", 3),
        ("reduce_scatter", 3, "float32", "WORLD", 3),
        ("all_to_all", 3, "float32", "WORLD", 3),
        ("gather", 1, "float32", "WORLD", 3),
        ("scatter", 3, "float32", "WORLD", 3),
        ("all_reduce", 1, "float32", "pair", 2),
        ("send", 2, "float32", "WORLD", 3),
        ("barrier", 0, "float32", "WORLD", 3),
    ]
    pair = [e for e in r0.trace if e.group == "pair"]
    assert [(e.seq, e.origin, e.reduce_op, e.async_op) for e in pair] == [
        (1, "user.pair_max", "max", True),
        (2, "user.pair_max", "max", True),
    ]
    assert [(e.seq, e.op, e.peer) for e in r2.trace if e.op == "recv"] == [(1, "recv", 0), (2, "recv", 0)]
    assert [e.seq for e in r2.trace if e.group == "WORLD" and e.op != "recv"] == list(range(1, 18))
    assert [e.root for e in r0.trace[:7]] == [None, 2, None, None, None, 0, 1]
    assert r0.trace[-1].phase == "after" and r0.trace[-1].dtype == "float64"


def test_ctrl_c_stops_every_rank_and_keeps_a_partial_report(tmp_path):
    wd = tmp_path / "wd"
    proc = subprocess.Popen(
        [sys.executable, "-m", "real_backend.launch", "run", str(REAL / "sigkill.toml"), "--workdir", str(wd)],
        cwd=ROOT,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
    )
    try:
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:  # wait until both ranks are inside their loop
            its = [
                json.loads((wd / f"rank{r}.progress").read_text()).get("iteration")
                if (wd / f"rank{r}.progress").exists()
                else None
                for r in (0, 1)
            ]
            if all(i is not None and i >= 1 for i in its):
                break
            time.sleep(0.1)
        # Nothing listens beyond this host: the launcher's store and the ranks' Gloo pairs.
        listening = listening_sockets([proc.pid, *descendants(proc.pid)])
        assert listening and {addr for addr, _ in listening} == {"127.0.0.1"}, listening
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode != 0
    assert b"interrupted" in err
    partial = json.loads((wd / "report.partial.json").read_text())
    assert [r["status"] for r in partial["ranks"]] == ["aborted", "aborted"]
    assert all(r["error"]["type"] == "KeyboardInterrupt" and r["trace"] for r in partial["ranks"])
    assert _processes_mentioning(str(wd)) == []


def test_host_errors_are_one_line():
    base = {"inputs": {"base": 1}, "loop": [{"kind": "collective", "op": "all_reduce"}]}
    with pytest.raises(LimitError, match=r"^world_size: 65 CPU rank processes on this host, over the limit of 64 "
                                         r"rank processes per run on this host \(set SIMDIST_MAX_LOCAL_RANKS=100 to allow it\)$"):
        run_real(parse_scenario({**base, "world_size": 65}))
    if not torch.cuda.is_available():
        with pytest.raises(HostError, match="nccl.*CUDA devices"):
            run_real(parse_scenario({**base, "world_size": 2, "backend": "nccl"}))


# Sim-vs-real agreement on every bundled scenario lives in tests/test_fidelity.py.


def test_warnings_the_program_shows_agree_with_the_simulator(tmp_path):
    # A rank outside a group: torch warns once per op and communicates nothing; DDP given
    # broadcast_buffers warns once. The real report keeps what Python showed on the rank's main
    # thread; the simulator's models issue the same texts.
    from simdist.compare import compare_reports
    from simdist.sim import simulate

    s, report, _ = _run("non_members", tmp_path)
    _check_expect(s, report)
    sim = simulate(s)
    assert compare_reports(sim, report).agree
    assert [r.warnings for r in report.ranks] == [r.warnings for r in sim.ranks]
    outsider = report.ranks[2]
    functions = ["all_reduce", "broadcast", "all_gather", "reduce_scatter_single", "reduce", "gather", "scatter",
                 "all_to_all_single", "barrier"]
    assert outsider.warnings[1:] == [f"Running {f} on global rank 2 which does not belong to the given group."
                                     for f in functions]
    assert outsider.warnings[0].startswith("`broadcast_buffers` is deprecated")
    assert outsider.trace == [e for e in outsider.trace if e.group == "WORLD"] and "ar" not in outsider.observed
    assert report.ranks[0].observed["ar"] == [2.0, 2.0]
