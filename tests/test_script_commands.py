"""A script goes wherever a scenario goes: `simdist run|check|real|compare SCRIPT.py`, with the
same exit codes (0 passed / agree, 1 failed / differ, 2 bad input, 130 interrupted), and no
process of the run left behind whatever happens (found by a tag in their environment)."""

from __future__ import annotations

import json
import subprocess
import textwrap
from pathlib import Path

import pytest

from tests.conftest import EXAMPLES, ROOT, line_of
from tests.conftest import run_cli_tagged as _cli


def _one_line_error(res: subprocess.CompletedProcess, text: str, alone: bool = True) -> None:
    """Exit 2 and one `error:` line holding `text`; `alone`: nothing else on stderr (False
    where the script itself writes there first: its own traceback is the user's to see)."""
    assert res.returncode == 2, res.stdout + res.stderr
    lines = [line for line in res.stderr.splitlines() if line.startswith("error:")]
    assert len(lines) == 1 and text in lines[0], res.stderr
    assert "Traceback" not in res.stdout
    if alone:
        assert res.stderr.strip().splitlines() == lines, res.stderr


def _script(tmp_path: Path, body: str, head: str = "") -> Path:
    p = tmp_path / "train.py"
    p.write_text(head + textwrap.dedent(body))
    return p


HEAD = """
import os, sys, torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
"""


# ---------------------------------------------------------------- usage (no rank starts)
@pytest.mark.parametrize(("args", "text"), [
    (("real", "examples/join_tutorial_ddp.py", "--backend", "nccl"), "real runs the script on real Gloo"),
    (("compare", "scenarios/ddp_join_uneven.toml", "scenarios/no_join_exit.toml"), "takes one scenario file"),
    (("run", "scenarios/ddp_join_uneven.toml", "--zero-compute"), "--zero-compute: only for a script"),
    (("check", "scenarios/ddp_join_uneven.toml", "--batches", "3,4"), "--batches: only for a script"),
    (("real", "scenarios/ddp_join_uneven.toml", "--nproc-per-node", "2"), "--nproc-per-node: only for a script"),
    (("compare", "missing.py"), "does not exist"),
    (("check", "examples/join_tutorial_ddp.py", "--batches", "x"), "batches:"),
    (("real", "scenarios/ddp_join_uneven.toml", "--hang-after", "2"), "--hang-after: only for a script"),
    (("compare", "examples/join_tutorial_ddp.py", "--hang-after", "-1"), "--hang-after: must be a number of seconds"),
])
def test_script_options_and_bad_usage_are_one_line_and_exit_2(args, text):
    res, _ = _cli(*args, timeout=120)
    _one_line_error(res, text)


# ---------------------------------------------------------------- the four commands
@pytest.mark.real
def test_compare_finds_the_counter_tutorial_in_agreement_with_real_gloo(tmp_path):
    res, _ = _cli("compare", str(EXAMPLES / "join_tutorial_counter.py"), "--json", cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    d = json.loads(res.stdout)
    assert d["agree"] and d["sim"]["source"] == "sim" and d["real"]["source"] == "real"
    for side in ("sim", "real"):  # the printed lines were compared, and are the tutorial's
        assert d[side]["ranks"][0]["output"] == ["10 inputs processed before rank 0 joined!",
                                                 "11 inputs processed across all ranks!"]


@pytest.mark.real
def test_compare_of_a_script_that_hangs_on_real_gloo_takes_seconds_and_says_which_rule_ended_it(tmp_path):
    """The default watchdog is 300 s; the stall rule ends the real side after --hang-after."""
    res, _ = _cli("compare", str(ROOT / "tests" / "scripts" / "recv_nobody_sends.py"), "--nproc-per-node", "2",
                  "--hang-after", "1", timeout=200, cwd=tmp_path)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "\nrecv_nobody_sends.py: sim and real agree (outcome hang)\n" in res.stdout, res.stdout  # after its lines
    assert "real side: hang found early (--hang-after 1 s, not the 300 s watchdog): " in res.stdout, res.stdout


@pytest.mark.real
def test_compare_reports_the_first_printed_line_that_differs(tmp_path):
    p = _script(tmp_path, head=HEAD, body="""
        t = torch.ones(2) * (rank + 1)
        dist.all_reduce(t)
        print("sum", t.tolist())
        print("pid", os.getpid())
        open(f"out{rank}.txt", "w").write("written")
    """)
    res, _ = _cli("compare", str(p), "--nproc-per-node", "2", cwd=tmp_path)
    assert res.returncode == 1, res.stdout + res.stderr
    assert "sim and real DIFFER (outcome sim completed, real completed)" in res.stdout
    assert "printed line 2 differs" in res.stdout and "printed line 1" not in res.stdout
    assert "first diverging collective" not in res.stdout  # the all_reduce agrees
    lines = res.stdout.splitlines()  # the files the simulated side wrote were set aside, and it says where
    moved = next(ln for ln in lines if ln.startswith("working directory: the simulated side's files moved to"))
    folder = moved.split(" moved to ")[1].split(";")[0]
    assert lines[-2:] == [f"  out{r}.txt: created by the simulated side, its version in {folder}/out{r}.txt"
                          for r in (0, 1)]
    assert all((tmp_path / folder / f"out{r}.txt").is_file() and (tmp_path / f"out{r}.txt").is_file() for r in (0, 1))


@pytest.mark.real
def test_check_explains_the_no_join_hang_and_draws_its_wait_for_graph(tmp_path):
    graph = tmp_path / "wf.dot"
    res, _ = _cli("check", "examples/join_tutorial_no_join.py", "--json", "--graph", str(graph))
    assert res.returncode == 1, res.stdout + res.stderr
    d = json.loads(res.stdout)
    assert d["verdict"]["failed"] and d["verdict"]["outcome"] == "hang" and d["judged_by"] == "checker"
    assert not d["passed"]
    text = "\n".join(d["explanation"])
    assert "rank 1 is blocked in #11 all_reduce[2]" in text and "ddp.backward.bucket_allreduce" in text
    assert f"join_tutorial_no_join.py:{line_of(EXAMPLES / 'join_tutorial_no_join.py', 'loss.backward()')}" in text
    assert "rank 0 left: returned normally" in text
    assert graph.read_text() == d["waitfor_dot"] and "digraph" in d["waitfor_dot"]


@pytest.mark.real
def test_check_and_run_pass_on_the_join_tutorial_and_real_judges_the_real_report():
    res, _ = _cli("check", "examples/join_tutorial_ddp.py")
    assert res.returncode == 0, res.stdout + res.stderr
    assert "ok (completed)" in res.stdout.splitlines()  # after the script's own lines
    res, _ = _cli("real", "examples/join_tutorial_no_join.py", "--json")
    assert res.returncode == 1, res.stdout + res.stderr  # on real Gloo the exited peer fails rank 1
    d = json.loads(res.stdout)
    assert d["source"] == "real" and [r["status"] for r in d["ranks"]] == ["completed", "error"]
    assert d["ranks"][1]["error"]["category"] == "peer_lost"


# ---------------------------------------------------------------- bad input, failing scripts
@pytest.mark.real
@pytest.mark.parametrize(("body", "text", "alone"), [
    (None, "train.py does not exist", True),
    ("def f(:\n", "train.py does not parse: invalid syntax (line 1)", True),
    ("print('no process group here')\n", "never initialised a process group: rank(s) 0, 1: returned normally "
                                          "before init_process_group (exit codes [0, 0])", True),
    ("raise ValueError('before init')\n", "never initialised a process group: rank(s) 0, 1: raised ValueError: "
                                         "before init before init_process_group at train.py:1 (exit codes [1, 1]); "
                                         "the error is the script's own", False),  # + its traceback
    ("import os\nos._exit(4)\n", "never initialised a process group: rank(s) 0, 1: os._exit(4) before "
                                 "init_process_group at train.py:2 (exit codes [4, 4])", True),
    (HEAD + "dist.all_reduce(torch.ones(2, dtype=torch.uint16))\n",
     "script: a tensor of dtype uint16 is not supported by the simulated backend (rank 0 at train.py:6 in "
     "<module>: dist.all_reduce(", True),
    ("import os\nimport torch.distributed.rpc as rpc\nrpc.init_rpc('w' + os.environ['RANK'], world_size=2)\n",
     "script: torch.distributed.rpc.init_rpc (RPC) is not supported by the simulated backend (worker 'w0' at "
     "train.py:3 in <module>: rpc.init_rpc(", True),  # no rank: the process leaves its error itself
], ids=["missing", "does-not-parse", "no-process-group", "raises-before-init", "os-exit-before-init",
        "cannot-model", "rpc"])
def test_bad_scripts_are_one_line_exit_2_and_leave_no_process(tmp_path, body, text, alone):
    p = tmp_path / "train.py" if body is None else _script(tmp_path, body)
    res, _ = _cli("run", str(p), "--nproc-per-node", "2")
    _one_line_error(res, text, alone)


@pytest.mark.real
def test_a_torchrun_script_run_without_nproc_per_node_is_told_to_give_it(tmp_path):
    """Run as-is, a script that reads torchrun's variables dies before init_process_group:
    the one line says why it ran as-is and which option it needs (it imports no torch: fast)."""
    p = _script(tmp_path, "import os\nlocal_rank = int(os.environ['LOCAL_RANK'])\n")
    res, _ = _cli("run", str(p))
    _one_line_error(res, "never initialised a process group: the script's own process (pid ", alone=False)
    _one_line_error(res, ") raised KeyError: 'LOCAL_RANK' before init_process_group at train.py:2 (exit codes [1]); "
                         "it ran as `python train.py` because --nproc-per-node was not given: a script that torchrun "
                         "starts needs --nproc-per-node N", alone=False)


@pytest.mark.real
def test_scripts_that_raise_or_os_exit_are_reported_and_exit_1(tmp_path):
    """Not bad input: the report says which rank left, how and where (the documented outcome)."""
    p = _script(tmp_path, head=HEAD, body="""
        if rank == 1:
            raise ValueError("bad batch")
        if rank == 2:
            os._exit(3)
        dist.barrier()
    """)
    res, _ = _cli("run", str(p), "--nproc-per-node", "3")
    assert res.returncode == 1, res.stdout + res.stderr
    raised, exited, barrier = (line_of(p, x) for x in ("raise ValueError", "os._exit(3)", "dist.barrier()"))
    assert "outcome: error" in res.stdout
    assert f'rank 1 left: raised ValueError: bad batch at train.py:{raised} in <module>: raise ValueError("bad batch")' \
        in res.stdout
    assert f"rank 2 left: os._exit(3): exit code 3 at train.py:{exited} in <module>: os._exit(3)" in res.stdout
    assert "rank 0 left: raised RuntimeError: Connection closed by peer (rank " in res.stdout  # Gloo's rule
    assert f"at train.py:{barrier} in <module>: dist.barrier()" in res.stdout
    assert "[rank1]: ValueError: bad batch" in res.stderr  # the script's own traceback, as torchrun shows it


@pytest.mark.real
def test_zero_compute_makes_two_cli_runs_give_the_same_report(tmp_path):
    """Operations, outcome, values, printed lines and every time: the same run to run."""
    p = _script(tmp_path, head=HEAD, body="""
        t = torch.arange(4, dtype=torch.float32) * (rank + 1)
        dist.all_reduce(t)
        g = dist.new_group([0, 1])
        if rank < 2:
            dist.broadcast(t, src=1, group=g)
        print(t.tolist())
    """)
    docs = []
    for _ in range(2):
        res, _ = _cli("run", str(p), "--nproc-per-node", "3", "--zero-compute", "--json")
        assert res.returncode == 0, res.stdout + res.stderr
        d = json.loads(res.stdout)
        d.pop("timings")
        docs.append(d)
    assert docs[0] == docs[1]
    assert [r["output"] for r in docs[0]["ranks"]] == [["[0.0, 6.0, 12.0, 18.0]"]] * 3
    assert all("compute" not in r for r in docs[0]["ranks"])  # none measured


def test_a_cuda_move_on_the_cpu_keeps_its_arguments(monkeypatch):
    """`Tensor.cuda`/`Tensor.to`, remapped on the class, place the tensor on the CPU and keep
    every other argument (`memory_format` was dropped by `.cuda`); patched in-process and
    restored, not in a rank."""
    import torch

    from simdist.script.rank import devices

    for name in ("to", "cuda", "pin_memory"):
        monkeypatch.setattr(torch.Tensor, name, getattr(torch.Tensor, name))
    devices._patch_tensor_moves()
    t = torch.arange(6.0).reshape(1, 2, 3, 1)
    cl = torch.channels_last
    assert not t.is_contiguous(memory_format=cl)
    assert t.cuda(memory_format=cl).is_contiguous(memory_format=cl)
    assert t.cuda(1, True).device.type == "cpu"
    assert t.to("cuda:1", torch.float64, memory_format=cl).is_contiguous(memory_format=cl)
    assert t.to(device=0, dtype=torch.int32).dtype == torch.int32
    assert t.to(torch.zeros(1, dtype=torch.float16)).dtype == torch.float16


def test_cuda_storages_and_threads_are_remapped_too(monkeypatch):
    """`torch.load(..., map_location="cuda:1")` (and a checkpoint saved on a GPU) moves each
    storage through `torch.storage._to`, and a thread the script starts has a mode stack of
    its own: both reached CUDA ("Torch not compiled with CUDA enabled") before. Patched
    in-process and restored, not in a rank."""
    import io
    import threading

    import torch
    import torch.storage

    from simdist.script.rank import devices

    monkeypatch.setattr(torch.storage, "_to", torch.storage._to)
    monkeypatch.setattr(threading.Thread, "_bootstrap_inner", threading.Thread._bootstrap_inner)
    buf = io.BytesIO()
    torch.save({"w": torch.arange(3.0)}, buf)
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)  # the rank's shims (`_install_cuda_shims`)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 8)
    buf.seek(0)
    with pytest.raises((AssertionError, RuntimeError), match="compiled with(out)? CUDA"):
        torch.load(buf, map_location="cuda:1")
    devices._patch_storage_moves()
    devices._enter_in_new_threads()
    for where in ("cuda:1", torch.device("cuda", 0), {"cpu": "cuda:0"}):
        buf.seek(0)
        assert torch.load(buf, map_location=where)["w"].tolist() == [0.0, 1.0, 2.0]
    assert torch.UntypedStorage(4).cuda().device.type == "cpu"
    got: list = []
    t = threading.Thread(target=lambda: got.append(torch.zeros(2, device="cuda").device.type))
    t.start()
    t.join()
    assert got == ["cpu"]


def test_cuda_autocast_autocasts_on_the_cpu(monkeypatch):
    """`torch.autocast("cuda", ...)` in a rank (where torch.cuda says a GPU is there) failed
    with "Torch not compiled with CUDA enabled" when it asked whether the GPU does bfloat16:
    it now autocasts on the CPU, to CUDA's dtype (float16 unless given). In-process, restored."""
    import warnings

    import torch
    from torch.amp.autocast_mode import autocast

    from simdist.script.rank import amp

    monkeypatch.setattr(autocast, "__init__", autocast.__init__)
    for name in ("is_autocast_enabled", "get_autocast_dtype", "get_autocast_gpu_dtype"):  # (its state reads)
        monkeypatch.setattr(torch, name, getattr(torch, name))
    amp.install()
    lin, x = torch.nn.Linear(2, 2), torch.ones(1, 2)
    with torch.autocast(device_type="cuda", dtype=torch.bfloat16):
        assert lin(x).dtype == torch.bfloat16
    with warnings.catch_warnings():
        warnings.simplefilter("ignore", FutureWarning)  # torch.cuda.amp.autocast is deprecated
        with torch.cuda.amp.autocast():
            assert lin(x).dtype == torch.float16
    assert lin(x).dtype == torch.float32
