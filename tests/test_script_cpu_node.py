"""`--gpus-per-node 0`: a CPU-only node, where the script sees this host's torch (a CPU build)
with no simulated GPU, on both sides of `compare`; the default, 8 simulated GPUs.

Each case runs the same program on simulated ranks, on real Gloo (`compare_script`) and under
plain `torchrun` on this host, whose machine a CPU-only node is: all three must agree."""

from __future__ import annotations

import os
import re
import subprocess
import sys

import pytest

from tests.conftest import ROOT
from tests.test_script_examples import _verdict, differences
from tests.test_third_party_scripts import _both

SCRIPT = ROOT / "tests" / "scripts" / "cuda_or_cpu.py"
NCCL = ROOT / "tests" / "scripts" / "nccl_init.py"
PICKS = re.compile(r"^\[\d\] (cuda available|sum) ")


def torchrun(script, args: list[str], cwd) -> tuple[subprocess.CompletedProcess, list[str]]:
    """The script under plain torchrun on this host, 2 ranks (no simdist anywhere), and the
    lines its ranks printed, sorted (each rank's stdout to a file of its own: through one pipe
    the two ranks' lines interleave)."""
    logs = cwd / "torchrun-logs"
    done = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--standalone",
                           "--log-dir", str(logs), "--redirects", "1", str(script), *args], capture_output=True,
                          text=True, timeout=180, cwd=cwd, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    lines = [line for f in logs.rglob("stdout.log") for line in f.read_text().splitlines()]
    assert len(list(logs.rglob("stdout.log"))) == 2, done.stderr
    return done, sorted(lines)


def printed(report) -> list[str]:
    return sorted(line for r in report.ranks for line in r.output if PICKS.match(line))


@pytest.mark.real
def test_a_cpu_only_node_takes_the_scripts_cpu_path_as_torchrun_here_does(cpu_node_zygote, tmp_path):
    """`torch.cuda.is_available()` False, `device_count()` 0: the script picks Gloo and the CPU
    on both sides, and plain torchrun on this CPU-only host prints the same lines."""
    sim, real = _both(SCRIPT, 2, [], cpu_node_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert printed(sim) == sorted([f"[{r}] cuda available False, devices 0, backend gloo, device cpu, cuda version None" for r in (0, 1)]
                                  + [f"[{r}] sum [3.0, 3.0] on cpu" for r in (0, 1)])
    here, lines = torchrun(SCRIPT, [], tmp_path)
    assert here.returncode == 0, here.stderr
    assert [line for line in lines if PICKS.match(line)] == printed(sim)


@pytest.mark.real
def test_by_default_the_node_has_eight_gpus_and_the_script_takes_its_gpu_path(script_zygote, tmp_path):
    """The default node: 8 simulated GPUs, so the same script asks for NCCL and `cuda:{local_rank}`
    (Gloo stands in on the real side), as on an 8-GPU machine, whose torch is a CUDA build
    (`torch.version.cuda` "13.0", `rank.cuda_build`; None on the CPU-only node)."""
    sim, real = _both(SCRIPT, 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert "[1] cuda available True, devices 8, backend nccl, device cuda:1, cuda version 13.0" in printed(sim)
    assert "[0] sum [3.0, 3.0] on cuda" in printed(sim)


@pytest.mark.real
def test_cuda_on_a_cpu_only_node_raises_torchs_own_error_as_the_programs(cpu_node_zygote, tmp_path):
    """`.cuda()` on a CPU-only node raises torch's "Torch not compiled with CUDA enabled": the
    program's own error there (as under torchrun here), not a simulated GPU's gap refused as
    unsupported."""
    sim, real = _both(SCRIPT, 2, ["--try-cuda"], cpu_node_zygote, tmp_path)
    assert _verdict(sim) == ["error:other"] * 2
    assert differences(sim, real) == []
    assert all("Torch not compiled with CUDA enabled" in r.error.message for r in sim.ranks)
    here, lines = torchrun(SCRIPT, ["--try-cuda"], tmp_path)
    assert here.returncode != 0 and here.stderr.count("AssertionError: Torch not compiled with CUDA enabled") == 2
    assert [line for line in lines if PICKS.match(line)] == printed(sim)


@pytest.mark.real
@pytest.mark.parametrize("backend", ["nccl", "cpu:gloo,cuda:nccl", "new_group"])
def test_nccl_on_a_cpu_only_node_is_refused_as_this_hosts_torch_refuses_it(backend, cpu_node_zygote, tmp_path):
    """A CPU build has no NCCL: `init_process_group("nccl")` (or a cuda:nccl pair, or
    `new_group(backend="nccl")`) raises "Distributed package doesn't have NCCL built in" on every
    rank after the rendezvous, where both simdist sides would otherwise run it on their own
    backend. torchrun here raises the same."""
    sim, real = _both(NCCL, 2, [backend], cpu_node_zygote, tmp_path)
    assert differences(sim, real) == []
    assert all(r.error is not None and "Distributed package doesn't have NCCL built in" in r.error.message
               for r in sim.ranks)
    here, lines = torchrun(NCCL, [backend], tmp_path)
    assert here.returncode != 0
    assert lines == sorted(line for r in sim.ranks for line in r.output) and len(lines) == 2
    assert all(line.endswith("raised Distributed package doesn't have NCCL built in") for line in lines)


@pytest.mark.parametrize("value", ["-1", "two", "2.5", "100000"])
def test_a_bad_gpu_count_is_one_line_naming_the_flag(value, tmp_path):
    script = tmp_path / "t.py"
    script.write_text("print(1)\n")
    for command in ("run", "compare"):
        res = subprocess.run([sys.executable, "-m", "simdist", command, str(script), "--nproc-per-node", "1",
                              f"--gpus-per-node={value}"], capture_output=True, text=True, timeout=60, cwd=tmp_path)
        assert res.returncode == 2 and res.stdout == ""
        assert res.stderr.splitlines() == [f"error: --gpus-per-node: must be a whole number of GPUs from 0 (a "
                                           f"CPU-only node) to 1024, got {value if value.startswith(('-', '1')) else repr(value)}"]


@pytest.mark.real
def test_ddp_refuses_the_bf16_hook_on_a_cpu_only_node_as_a_cpu_build_does(cpu_node_zygote, tmp_path):
    """tests/scripts/ddp_comm_hooks.py on a CPU-only node: DDP refuses `bf16_compress_hook`
    ("required CUDA 11+ and NCCL 2.10+"), as this host's CPU build does, where on simulated GPUs
    (a CUDA build) it runs (`test_ddp_comm_hooks_agree_with_real_gloo`)."""
    sim, real = _both(ROOT / "tests" / "scripts" / "ddp_comm_hooks.py", 2, [], cpu_node_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert any(line.startswith("[bf16 rank0] refused: BF16 all reduce communication hook required")
               for line in sim.ranks[0].output)
