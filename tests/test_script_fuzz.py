"""`simdist fuzz SCRIPT.py`: the search over per-rank batch caps and world sizes on forked
ranks, its shrinking, what it writes down, and how it treats scripts that fail anyway.

Budgets are reduced here (CI); bench/script_walltime.py runs the full 200 schedules."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from simdist.errors import ScriptError
from simdist.fuzz.scripts import Space, fuzz_script
from simdist.script import run_script
from simdist.script.launch import tagged_processes
from simdist.script.zygote import Zygote
from tests.conftest import EXAMPLES, ROOT, descendants, run_cli, trace_keys

pytestmark = pytest.mark.real

NO_JOIN = "examples/fuzz_ddp_dataloader_no_join.py"
JOIN = "examples/fuzz_ddp_dataloader_join.py"


def test_a_forked_rank_runs_the_script_as_a_launched_one_does():
    path = EXAMPLES / "fuzz_ddp_dataloader_no_join.py"
    kw = dict(nproc_per_node=3, batches="2,3,3", measure_compute=False, backend="gloo", args=["--epochs", "1"])
    plain = run_script(path, stdout=subprocess.DEVNULL, **kw)
    with Zygote(path, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL) as z:
        forked = [run_script(path, zygote=z, run_id=f"zyg{i}", **kw) for i in range(2)]
        assert all(tagged_processes(f"zyg{i}") == [] for i in range(2))
        with pytest.raises(ScriptError, match="zygote: a fork server for .*no_join.py .* cannot run .*_join.py"):
            run_script(EXAMPLES / "fuzz_ddp_dataloader_join.py", zygote=z, **kw)  # one made for a script runs it only
    assert tagged_processes(z.run_id) == [] and descendants(os.getpid()) == []
    for rep in forked:
        assert rep.outcome == plain.outcome == "error"
        for a, b in zip(rep.ranks, plain.ranks, strict=True):
            assert (a.status, a.output, a.stderr[:1], a.exit, a.inputs_processed) == \
                   (b.status, b.output, b.stderr[:1], b.exit, b.inputs_processed)
            assert trace_keys(a.trace) == trace_keys(b.trace) and a.location == b.location
            assert (a.error.category if a.error else None) == (b.error.category if b.error else None)


def test_a_zygote_for_any_script_runs_only_its_mode_and_gpu_count(script_zygote):
    """The session's zygote (made for no script) refuses, before any process starts, a run it
    could not give as a launched one would."""
    z, path = script_zygote("sim"), EXAMPLES / "fuzz_ddp_dataloader_join.py"
    with pytest.raises(ScriptError, match=r"zygote: a fork server for scripts \(sim\) cannot run .* \(gloo\)"):
        run_script(path, nproc_per_node=2, mode="gloo", zygote=z)
    with pytest.raises(ScriptError, match="gpus: 4 asked for, but the zygote simulates 8"):
        run_script(path, nproc_per_node=2, gpus=4, zygote=z)
    assert descendants(z.pid) == []


def test_a_forked_rank_starts_in_the_launchers_working_directory(script_zygote, tmp_path, monkeypatch):
    """Where a launched rank would start (it inherits the launcher's), not where the zygote did."""
    z = script_zygote("sim")  # started (or already running) elsewhere
    p = tmp_path / "where.py"
    p.write_text("import os\nimport torch.distributed as dist\ndist.init_process_group('gloo')\nprint(os.getcwd())\n")
    (tmp_path / "sub").mkdir()
    monkeypatch.chdir(tmp_path / "sub")
    rep = run_script(p, nproc_per_node=2, zygote=z)
    assert [r.output for r in rep.ranks] == [[str(tmp_path / "sub")]] * 2


def test_a_forked_rank_runs_its_scripts_finalizers_at_exit_and_not_the_fork_servers(script_zygote, tmp_path):
    """The fork server keeps the exit-time finalizers of its own imports from running in a rank
    (torch's ~170 `Library` ones: 30 ms of CPU a rank, to tidy up a process that is ending);
    the script's own still run at exit, as in a launched process."""
    p = tmp_path / "fin.py"
    p.write_text("import weakref\nimport torch.distributed as dist\nclass Box: pass\nbox = Box()\n"
                 "dist.init_process_group('gloo')\n"
                 "pending = lambda: sum(f.atexit for f in weakref.finalize._registry)\n"
                 "weakref.finalize(box, lambda: print('finalized; still to run at exit:', pending()))\n")
    rep = run_script(p, nproc_per_node=2, zygote=script_zygote("sim"))
    assert rep.outcome == "completed" and [r.output for r in rep.ranks] == [["finalized; still to run at exit: 0"]] * 2


def _wait_for(cond, timeout_s=30.0):
    deadline = time.monotonic() + timeout_s
    while not cond() and time.monotonic() < deadline:
        time.sleep(0.02)
    return cond()


def _spares(z) -> set[int]:
    """The fork server's spares: its children still in its process group (a rank leads its own)."""
    out = set()
    for pid in descendants(z.pid):
        with contextlib.suppress(OSError):
            if os.getpgid(pid) == os.getpgid(z.pid):
                out.add(pid)
    return out


def test_a_fork_servers_spares_become_a_runs_ranks_and_end_when_no_longer_wanted(script_zygote, tmp_path):
    """`keep_spares` (the fuzzer's): children forked ahead of a request become the run's ranks
    (each the script in a process of its own), new ones are made for the next run, and
    spares no longer wanted end."""
    z = script_zygote("sim")
    p = tmp_path / "pid.py"
    p.write_text("import os\nimport torch.distributed as dist\ndist.init_process_group('gloo')\nprint(os.getpid())\n")
    try:
        z.keep_spares(2)
        assert _wait_for(lambda: len(_spares(z)) == 2)
        spares = _spares(z)
        first = run_script(p, nproc_per_node=2, zygote=z)
        assert first.outcome == "completed" and {int(r.output[0]) for r in first.ranks} == spares
        assert _wait_for(lambda: len(_spares(z)) == 2) and not spares & _spares(z)
        second = run_script(p, nproc_per_node=2, zygote=z)
        assert second.outcome == "completed" and len({int(r.output[0]) for r in second.ranks} - spares) == 2
    finally:
        z.keep_spares(0)
    assert _wait_for(lambda: descendants(z.pid) == [])


@pytest.fixture(scope="module")
def no_join_search(tmp_path_factory):
    """`simdist fuzz` on the no-Join DataLoader example, as a user runs it (one search shared
    by the tests below): its result and the folder it wrote into."""
    out = tmp_path_factory.mktemp("found")
    res = run_cli("fuzz", NO_JOIN, "--nproc-per-node-range", "2:4", "--budget", "25", "--seed", "1", "--out",
                  str(out), "--json", timeout=600)
    assert res.returncode == 1, res.stderr
    (r,) = json.loads(res.stdout)["results"]
    return r, out


def test_fuzz_finds_the_hang_without_join_and_shrinks_it_to_two_ranks_one_batch_apart(no_join_search):
    """Issue 10's acceptance: the hang found and shrunk to 2 ranks whose batch counts differ by one."""
    r, out = no_join_search
    assert r["failed"] and not r["baseline_failed"] and r["schedules"] >= 3
    (c,) = r["counterexamples"]
    assert c["key"] == "hang/hang" and c["world_size"] == 2 and abs(c["caps"][0] - c["caps"][1]) == 1
    assert min(c["caps"]) == 1  # the smallest caps of the range
    batches = ",".join(map(str, c["caps"]))
    assert c["replay"] == f"simdist run {NO_JOIN} --nproc-per-node 2 --batches {batches}"
    assert c["replay_real"] == f"simdist compare {NO_JOIN} --nproc-per-node 2 --batches {batches}"
    (written,) = out.glob("*.sh")  # the unshrunk file written early was replaced
    assert str(written) == c["path"] and c["replay"] in written.read_text()
    assert any("loss = F.mse_loss(model(xb), yb)" in n or "loss.backward()" in n for n in c["explanation"])


def test_the_written_file_replays_the_hang_in_the_simulator_and_the_failure_on_real_gloo(no_join_search, tmp_path):
    """`sh FILE` from another folder, no simdist on PATH, reproduces the hang (exit 1);
    `sh FILE compare` runs the schedule on real Gloo beside the simulator under Gloo's rules:
    it fails there too (rank 1 loses its peer), and every rank agrees (exit 0)."""
    r, _ = no_join_search
    (c,) = r["counterexamples"]
    env = {**os.environ, "PATH": "/usr/bin:/bin"}
    res = subprocess.run(["sh", c["path"]], capture_output=True, text=True, cwd=tmp_path, timeout=300, env=env)
    assert res.returncode == 1, res.stderr
    assert "outcome: hang" in res.stdout and "rank 1 is blocked in" in res.stdout and "rank 0 left" in res.stdout
    res = subprocess.run(["sh", c["path"], "compare"], capture_output=True, text=True, cwd=tmp_path, timeout=600,
                         env=env)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "fuzz_ddp_dataloader_no_join.py: sim and real agree (outcome error)" in res.stdout
    assert [line.split(":")[1].split()[0] for line in res.stdout.splitlines() if line.startswith("  rank ")] == \
        ["agree", "agree"]


def test_fuzz_finds_nothing_with_join(tmp_path):
    res = fuzz_script(Space(JOIN, ("--epochs", "2"), worlds=(2, 4)), budget=12, seed=0, out_dir=tmp_path)
    assert not res.failed and not res.counterexamples and res.examples == 12 + 1  # + the baseline
    assert res.schedules >= 10 and res.rate > 0 and res.batches == [1, 8]
    assert not list(tmp_path.iterdir()) and descendants(os.getpid()) == []


@pytest.mark.slow
def test_fuzz_finds_nothing_with_join_in_200_schedules(tmp_path):
    """Issue 10's acceptance, at full size: 200 schedules (world sizes 2-4, caps 1-8) of the
    Join example, each run to the end on forked ranks, and nothing found."""
    res = run_cli("fuzz", JOIN, "--nproc-per-node-range", "2:4", "--budget", "200", "--out", str(tmp_path),
                  "--json", timeout=1800)
    assert res.returncode == 0, res.stdout[-2000:] + res.stderr
    (r,) = json.loads(res.stdout)["results"]
    assert not r["failed"] and r["examples"] == 200 + 1 and r["schedules"] >= 150
    assert r["worlds"] == [2, 4] and r["batches"] == [1, 8] and not list(tmp_path.iterdir())


def _script(tmp_path: Path, body: str) -> Path:
    p = tmp_path / "train.py"
    p.write_text(body)
    return p


def test_a_script_that_fails_on_every_schedule_is_reported_once(tmp_path):
    p = _script(tmp_path, "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                          "raise RuntimeError('broken before any batch')\n")
    res = run_cli("fuzz", str(p), "--nproc-per-node-range", "2:3", "--budget", "50", "--out", str(tmp_path / "o"))
    assert res.returncode == 1
    assert res.stdout.count("fails without uneven inputs") == 1 and "broken before any batch" in res.stdout
    assert "1 schedules" in res.stdout and "Traceback" not in res.stdout + res.stderr


def test_a_script_without_a_dataloader_explores_the_world_size_only(tmp_path):
    p = _script(tmp_path, "import torch, torch.distributed as dist\ndist.init_process_group('gloo')\n"
                          "t = torch.ones(1)\ndist.all_reduce(t)\nassert t.item() < 3, 'three ranks'\n")
    res = fuzz_script(Space(str(p), worlds=(2, 3)), budget=5, out_dir=tmp_path / "o")
    assert any("iterated no DataLoader" in n for n in res.notes) and res.batches is None
    (c,) = res.counterexamples
    assert (c.key, c.world_size, c.caps) == ("rank_error/error", 3, [])
    assert "--batches" not in c.replay and "AssertionError: three ranks" in " ".join(c.explanation)


@pytest.mark.parametrize(("body", "args", "text"), [
    (None, ["missing.py"], "does not exist"),
    ("def f(:\n", ["bad.py"], "does not parse"),
    ("print('no group')\n", ["never.py", "--nproc-per-node", "2"], "never initialised a process group"),
    ("", ["ok.py", "--nproc-per-node-range", "3:2"], "--nproc-per-node-range"),
    ("", ["ok.py", "--batches-range", "x"], "--batches-range"),
    ("", ["ok.py", "--nproc-per-node", "2", "--nproc-per-node-range", "2:3"], "one or the other"),
])
def test_fuzz_bad_input_is_one_line_and_exit_2(tmp_path, body, args, text):
    if body is not None:
        (tmp_path / args[0]).write_text(body)
    res = subprocess.run([sys.executable, "-m", "simdist", "fuzz", *args, "--out", str(tmp_path / "o")],
                         capture_output=True, text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 2, res.stderr
    assert text in res.stderr and len(res.stderr.strip().splitlines()) == 1 and "Traceback" not in res.stderr


def test_fuzz_out_must_be_a_folder_checked_before_any_run(tmp_path):
    (tmp_path / "ok.py").write_text("import torch.distributed as dist\n")
    (tmp_path / "f").write_text("")
    res = subprocess.run([sys.executable, "-m", "simdist", "fuzz", "ok.py", "--out", "f/sub"], capture_output=True,
                         text=True, cwd=tmp_path, timeout=300)
    assert res.returncode == 2 and res.stderr.strip().endswith("out: f is not a folder (for f/sub)"), res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_ctrl_c_writes_what_was_found_and_ends_every_process(tmp_path):
    out = tmp_path / "o"
    proc = subprocess.Popen([sys.executable, "-m", "simdist", "fuzz", NO_JOIN, "--nproc-per-node-range", "2:4",
                             "--budget", "500", "--out", str(out)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    deadline = time.time() + 300
    while not list(out.glob("*.sh")) and time.time() < deadline and proc.poll() is None:
        time.sleep(0.1)
    assert list(out.glob("*.sh")), "no failure found before the deadline"
    kids = descendants(proc.pid)
    proc.send_signal(signal.SIGINT)
    stdout, _ = proc.communicate(timeout=60)
    assert proc.returncode == 130
    assert "interrupted" in stdout and "hang/hang" in stdout
    (written,) = out.glob("*.sh")
    assert "interrupted (Ctrl-C)" in written.read_text()
    time.sleep(0.5)
    alive = [p for p in kids if os.path.exists(f"/proc/{p}") and "Z" not in open(f"/proc/{p}/stat").read().split()[2]]
    assert alive == []
