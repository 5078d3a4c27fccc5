"""`simdist run SCRIPT.py`: the same command as for scenarios, with torchrun-style options."""

from __future__ import annotations

import json

import pytest

from tests.conftest import run_cli

pytestmark = pytest.mark.real


def test_json_report_of_a_tutorial_program():
    res = run_cli("run", "examples/join_tutorial_counter.py", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)  # the script's own prints went to stderr, not into the JSON
    assert d["outcome"] == "completed" and d["source"] == "sim" and d["backend"] == "nccl"
    assert d["ranks"][0]["output"] == ["10 inputs processed before rank 0 joined!", "11 inputs processed across all ranks!"]
    assert "10 inputs processed before rank 0 joined!" in res.stderr


def test_hang_exits_1_and_names_the_line():
    res = run_cli("run", "examples/join_tutorial_no_join.py", timeout=300)
    assert res.returncode == 1
    assert "outcome: hang" in res.stdout and "loss.backward()" in res.stdout


def test_torchrun_style_with_script_arguments(tmp_path):
    p = tmp_path / "args.py"
    p.write_text(
        "import argparse, os, torch, torch.distributed as dist\n"
        "ap = argparse.ArgumentParser(); ap.add_argument('--steps', type=int); ap.add_argument('--backend')\n"
        "a = ap.parse_args()\n"
        "dist.init_process_group(a.backend)\n"
        "t = torch.zeros(1)\n"
        "for _ in range(a.steps):\n"
        "    t += 1\n"
        "    dist.all_reduce(t)\n"
        "print(os.environ['LOCAL_RANK'], os.environ['WORLD_SIZE'], int(t.item()))\n")
    res = run_cli("run", str(p), "--nproc-per-node", "3", "--json", "--", "--steps", "2", "--backend", "nccl",
                  timeout=300)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    # (0+1)*3 = 3, then (3+1)*3 = 12 on every rank
    assert [r["output"] for r in d["ranks"]] == [[f"{r} 3 12"] for r in range(3)]
    assert [len(r["trace"]) for r in d["ranks"]] == [2, 2, 2]


def test_batch_isend_irecv_ring_on_three_ranks(tmp_path):
    p = tmp_path / "ring.py"
    p.write_text(
        "import torch, torch.distributed as dist\n"
        "dist.init_process_group('gloo')\n"
        "r, w = dist.get_rank(), dist.get_world_size()\n"
        "send, recv = torch.full((3,), float(r)), torch.zeros(3)\n"
        "ops = [dist.P2POp(dist.isend, send, (r + 1) % w), dist.P2POp(dist.irecv, recv, (r - 1) % w)]\n"
        "for req in dist.batch_isend_irecv(ops):\n"
        "    req.wait()\n"
        "print(int(recv[0]))\n")
    res = run_cli("run", str(p), "--nproc-per-node", "3", "--json", timeout=300)
    assert res.returncode == 0, res.stderr
    d = json.loads(res.stdout)
    assert [r["output"] for r in d["ranks"]] == [["2"], ["0"], ["1"]]
    assert [[(e["op"], e["peer"]) for e in r["trace"]] for r in d["ranks"]] == \
        [[("send", (r + 1) % 3), ("recv", (r - 1) % 3)] for r in range(3)]
