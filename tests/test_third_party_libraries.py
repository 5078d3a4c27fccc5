"""Published scripts of the libraries users write their own train.py with, against real Gloo.

The fifth batch (docs/script-backend.md, "Fifth batch"): PyTorch Lightning's bug-report
`BoringModel` (its `Trainer` with `strategy="ddp"`, torchrun-style and as-is, when Lightning
starts its own ranks), Hugging Face Accelerate's own distributed test programs (what `accelerate
test` runs; `even_batches`, `join_uneven_inputs`, `no_sync`/`accumulate`) and transformers'
`Trainer` distributed test (evaluate, predict and a training step under DDP). They are other
people's code and not in this repository: docs/script-backend.md names each source and
commit or version and the edits, and the files go in examples/third_party/ (or
$SIMDIST_THIRD_PARTY). Neither are the libraries simdist's dependencies: each case skips when
its file or its library is missing (`pip install lightning accelerate transformers torchdata`,
none of which changes torch). Each runs on simulated ranks and on real Gloo as `simdist
compare` runs them, and the two must agree rank by rank; what no two real runs print alike (a
wall time, an unseeded loss) is set aside first, as in tests/test_third_party_scripts.py.
"""

from __future__ import annotations

import os
import re

import pytest

from simdist.errors import ScriptError
from simdist.script import run_script
from simdist.script.launch import new_run_id
from tests.conftest import ROOT
from tests.test_script_examples import _verdict, differences
from tests.test_third_party_scripts import THIRD_PARTY, _both, _scrub

LIGHTNING = THIRD_PARTY / "lightning"
ACCELERATE = THIRD_PARTY / "accelerate"
TRANSFORMERS = THIRD_PARTY / "transformers"


def _needs(module: str) -> None:
    pytest.importorskip(module, reason=f"{module} is not installed (an optional library: docs/script-backend.md)")


def _ops(report, rank: int) -> list[str]:
    return [e.op for e in report.ranks[rank].trace]


# ------------------------------------------------------------------ PyTorch Lightning
@pytest.mark.real
def test_lightning_ddp_on_the_cpu_agrees_with_real_gloo(script_zygote, tmp_path):
    """`Trainer(accelerator="cpu", strategy="ddp", devices=2)` under torchrun: Lightning finds
    torchelastic's environment, broadcasts its log folder from rank 0, wraps the model in DDP,
    and rank 0 alone writes the checkpoint and prints the test metrics (rich's table): every
    collective (36 a rank) and the printed loss as on real Gloo."""
    _needs("lightning")
    sim, real = _both(LIGHTNING / "bug_report_ddp_cpu.py", 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    ops = _ops(sim, 1)
    assert len(ops) == 36 and ops.count("barrier") >= 10 and "all_gather" in ops
    assert any("test_loss" in line for line in sim.ranks[0].output) and sim.ranks[1].output == []
    assert list((tmp_path / "lightning_logs").glob("version_0/checkpoints/*.ckpt"))  # the real side's


@pytest.mark.real
@pytest.mark.slow
@pytest.mark.parametrize("script,nproc", [("bug_report_ddp_cpu.py", None), ("bug_report_ddp_gpu.py", 2),
                                          ("bug_report_ddp_gpu.py", None), ("bug_report_ddp_spawn.py", None)])
def test_lightning_launching_its_own_ranks_agrees_with_real_gloo(script, nproc, script_zygote, tmp_path):
    """Run as `python script.py` (no torchrun), Lightning's launcher makes the script's process
    rank 0 and starts rank 1 as a new `python script.py` with LOCAL_RANK=1; on the simulated GPUs
    (`accelerator="gpu"`) it asks for NCCL and `cuda:{local_rank}`; `strategy="ddp_spawn"` starts
    both ranks with `mp.spawn` instead (new interpreters: 90 s). As on real Gloo."""
    _needs("lightning")
    sim, real = _both(LIGHTNING / script, nproc, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert len(_ops(sim, 0)) == 36


@pytest.mark.real
def test_lightning_with_a_rank_given_no_batch_fails_as_on_real_gloo(script_zygote, tmp_path):
    """`--batches 1,0`: rank 1's loader is empty. Lightning all-reduces whether any rank's loader
    is empty and rank 1 raises its own error ("`DataLoader` within local rank has zero length"),
    leaving rank 0 in a barrier whose peer is gone: on both sides, after the same collectives."""
    _needs("lightning")
    sim, real = _both(LIGHTNING / "bug_report_ddp_cpu.py", 2, [], script_zygote, tmp_path, batches="1,0")
    assert _verdict(sim) == ["error:peer_lost", "error:other"]
    assert differences(sim, real) == []
    assert "zero length" in sim.ranks[1].error.message
    assert _ops(sim, 0)[-1] == "barrier" and len(_ops(sim, 1)) == len(_ops(sim, 0)) - 1


# unseeded: no two real runs print one loss, and rich pads its table cell to the loss's width
_TEST_LOSS = re.compile(r"(test_loss\s+│)\s*-?\d+\.\d+(e-?\d+)?\s*│")


@pytest.mark.real
@pytest.mark.slow
def test_lightning_unedited_on_eight_simulated_gpus_agrees_but_for_its_unseeded_loss(script_zygote, tmp_path):
    """The bug-report script as published (`Trainer()`'s defaults: "auto" picks the 8 simulated
    GPUs, so DDP over 8 ranks under torchrun); only its loss, of unseeded data, differs."""
    _needs("lightning")
    sim, real = _both(LIGHTNING / "bug_report_model.py", 8, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 8
    _scrub(_TEST_LOSS, r"\1 _ │", sim, real)
    assert differences(sim, real) == []


@pytest.mark.real
def test_lightning_unedited_on_two_ranks_is_refused_as_lightning_refuses_it(script_zygote, tmp_path):
    """Unedited under torchrun with 2 ranks on an 8-GPU machine, Lightning refuses before any
    process group: "devices=8 ... does not match the world size (2)": bad input, one line."""
    _needs("lightning")
    path = LIGHTNING / "bug_report_model.py"
    if not path.is_file():
        pytest.skip(f"{path} is not here: third-party code, not in the repository (docs/script-backend.md)")
    with pytest.MonkeyPatch.context() as mp, pytest.raises(ScriptError, match=r"never initialised a process group: "
                                                           r"rank\(s\) 0, 1: raised ValueError: You set `devices=8`"):
        mp.chdir(tmp_path)
        run_script(path, nproc_per_node=2, timeout_s=120, run_id=new_run_id(), zygote=script_zygote("sim"))


# ------------------------------------------------------------------ Hugging Face Accelerate
@pytest.mark.real
def test_accelerate_even_batches_and_join_uneven_inputs_agree_with_real_gloo(script_zygote, tmp_path):
    """Accelerate's own data-loop test: `even_batches` pads the short rank's batches, and with it
    off `join_uneven_inputs` runs torch's Join under DDP (2 batches against 1), stateful loaders
    resume: 194 collectives a rank, completed on both sides."""
    _needs("accelerate")
    _needs("torchdata")  # its StatefulDataLoader cases; without it both sides fail alike there
    sim, real = _both(ACCELERATE / "test_distributed_data_loop.py", 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert len(_ops(sim, 1)) == 194
    assert "Test joining uneven inputs" in sim.ranks[0].output


@pytest.mark.real
def test_accelerate_join_on_the_cpu_hangs_as_on_real_gloo(script_zygote, tmp_path, monkeypatch):
    """With `ACCELERATE_USE_CPU=1` Accelerate's `join_uneven_inputs` only warns (Join is for its
    multi-GPU types) and the uneven loop goes on without it: rank 0's second forward waits in
    DDP's bucket rebuild (a broadcast) while rank 1, out of batches, waits in `wait_for_everyone`'s
    barrier: a hang, on both sides, each rank's fifth collective unfinished."""
    _needs("accelerate")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "1")
    sim, real = _both(ACCELERATE / "test_distributed_data_loop.py", 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["hang"] * 2
    assert differences(sim, real) == []
    assert [e.origin for e in sim.ranks[0].trace][-2:] == ["ddp.backward.bucket_allreduce",
                                                           "ddp.pre_forward.rebuild_buckets"]
    assert _ops(sim, 1)[-1] == "barrier" and len(_ops(sim, 1)) == 5


@pytest.mark.real
@pytest.mark.slow
def test_accelerate_gradient_sync_agrees_with_real_gloo(script_zygote, tmp_path):
    """Accelerate's sync test: `no_sync`, `accumulate` and gradient accumulation over DDP on the
    simulated GPUs, its gradients compared across ranks by the script itself: 426 collectives."""
    _needs("accelerate")
    sim, real = _both(ACCELERATE / "test_sync.py", 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert len(_ops(sim, 0)) == 426


@pytest.mark.real
def test_accelerate_test_script_fails_on_gloo_alike_and_runs_under_nccl(script_zygote, tmp_path):
    """`accelerate test`'s program on the simulated GPUs asks for NCCL and so gathers with
    `all_gather_into_tensor` into a flat output, which NCCL takes and Gloo refuses ("invalid
    tensor size"): under `compare` (Gloo on both sides) it fails alike at its RNG check; under the
    NCCL semantics it asks for (`simdist run`), it completes: 303 collectives a rank."""
    _needs("accelerate")
    sim, real = _both(ACCELERATE / "test_script.py", 2, [], script_zygote, tmp_path)
    assert _verdict(sim) == ["error:other"] * 2
    assert differences(sim, real) == []
    assert "invalid tensor size" in sim.ranks[0].error.message
    with pytest.MonkeyPatch.context() as mp:
        mp.chdir(tmp_path)
        rep = run_script(ACCELERATE / "test_script.py", nproc_per_node=2, timeout_s=300, run_id=new_run_id(),
                         zygote=script_zygote("sim"))
    assert rep.backend == "nccl" and _verdict(rep) == ["completed"] * 2
    assert len(rep.ranks[1].trace) == 303


# ------------------------------------------------------------------ transformers' Trainer
HF_ARGS = ["--output_dir", "out", "--report_to", "none"]
_HF_TIMES = re.compile(r"'train_(runtime|samples_per_second|steps_per_second)': '[\d.]+'")


@pytest.mark.real
@pytest.mark.parametrize("nproc", [2, pytest.param(3, marks=pytest.mark.slow)])
def test_transformers_trainer_agrees_with_real_gloo_but_for_its_times(nproc, script_zygote, tmp_path):
    """transformers' distributed Trainer test: evaluate and predict on 101, 40 and 7 samples
    (its metrics check that gathered predictions come back whole and in order, padding dropped),
    with and without `eval_accumulation_steps`, then one DDP training step on an iterable set.
    Rank 0 prints its training summary; only the times in it differ (as between two real runs)."""
    _needs("transformers")
    sim, real = _both(TRANSFORMERS / "test_trainer_distributed.py", nproc, HF_ARGS, script_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * nproc
    _scrub(_HF_TIMES, r"'train_\1': _", sim, real)
    assert differences(sim, real) == []
    assert "'train_loss': " in sim.ranks[0].output[-1]
    assert {"all_gather", "broadcast"} <= set(_ops(sim, nproc - 1))


@pytest.mark.real
def test_transformers_trainer_without_even_batches_fails_as_on_real_gloo(script_zygote, tmp_path):
    """`--accelerator_config '{"even_batches": false}'`: 101 samples in batches of 8 give rank 0
    one batch more, so the gathered predictions lack samples: rank 1's metrics fail and it calls
    `exit(1)` (the builtin: SystemExit, as torchrun reports it, exit code 1) while rank 0 is in
    its seventh gather, which then loses its peer: on both sides after the same collectives."""
    _needs("transformers")
    args = HF_ARGS + ["--accelerator_config", '{"even_batches": false}']
    sim, real = _both(TRANSFORMERS / "test_trainer_distributed.py", 2, args, script_zygote, tmp_path)
    assert _verdict(sim) == ["error:peer_lost", "error:other"]
    assert (sim.ranks[1].error.type, sim.ranks[1].error.message) == ("SystemExit", "exit code 1")
    assert differences(sim, real) == []
    assert len(_ops(sim, 0)) == len(_ops(sim, 1)) + 1


@pytest.mark.real
def test_lightning_with_uneven_batches_hangs_as_on_real_gloo(script_zygote, tmp_path):
    """4 training batches a rank (`limit_train_batches=4`), `--batches 4,3`: rank 1 runs out first
    and reaches ModelCheckpoint's epoch-end barrier while rank 0's fourth step broadcasts
    Lightning's SIGTERM flag: two collectives that Gloo never pairs, a hang on both sides at the
    28th collective. (Its progress bar off: with rich's refresh thread alive on rank 0, neither
    side can tell the hang from a thread about to post, and both wait for the watchdog.)"""
    _needs("lightning")
    sim, real = _both(LIGHTNING / "bug_report_ddp_uneven.py", 2, [], script_zygote, tmp_path, batches="4,3")
    assert _verdict(sim) == ["hang"] * 2
    assert differences(sim, real) == []
    assert [_ops(sim, r)[27] for r in (0, 1)] == ["broadcast", "barrier"] and len(_ops(sim, 0)) == 28
    assert any(f.kind == "op_mismatch" for f in sim.findings)


@pytest.mark.real
@pytest.mark.parametrize("how,code", [("exit", 3), ("raise", 4)])
def test_a_rank_leaving_by_the_builtin_exit_or_systemexit_fails_with_its_code(how, code, script_zygote, tmp_path):
    """transformers' test ends a rank by the builtin `exit(1)`, which raises SystemExit itself
    (no `sys.exit`, no excepthook): the rank was "returned normally" and its process exited 0 on
    both sides, where torchrun reports its exit code. Now its `SystemExit` and code, as for
    `sys.exit`, and the process's status is the code (torchrun's own run says so: checked)."""
    import subprocess
    import sys

    script = ROOT / "tests" / "scripts" / "builtin_exit.py"
    sim, real = _both(script, 2, [how], script_zygote, tmp_path)
    assert _verdict(sim) == ["error:peer_lost", "error:other"]
    assert differences(sim, real) == []
    assert (sim.ranks[1].error.type, sim.ranks[1].error.message) == ("SystemExit", f"exit code {code}")
    torchrun = subprocess.run([sys.executable, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                               "--standalone", str(script), how], capture_output=True, text=True, timeout=120,
                              cwd=tmp_path, env={**os.environ, "GLOO_SOCKET_IFNAME": "lo"})
    assert re.search(rf"rank\s*: 1 \(local_rank: 1\)\s*\n\s*exitcode\s*: {code}\b", torchrun.stderr), torchrun.stderr


@pytest.mark.real
def test_transformers_trainer_without_even_batches_on_a_cpu_only_node_runs_as_torchrun_here(cpu_node_zygote, tmp_path):
    """The even_batches case on a CPU-only node (`--gpus-per-node 0`): with no CUDA the Trainer
    is not distributed (helper-110 saw Accelerate's DistributedType.NO under torchrun): each
    process trains and evaluates alone, no collective, and each completes, where on 8 simulated GPUs rank 1 exits 1. Plain
    torchrun on this CPU-only host does the same (exit 0, each rank prints its training
    summary): the case helper-110 found simdist could not show before there was such a node."""
    from tests.test_script_cpu_node import torchrun

    _needs("transformers")
    script = TRANSFORMERS / "test_trainer_distributed.py"
    args = HF_ARGS + ["--accelerator_config", '{"even_batches": false}']
    sim, real = _both(script, 2, args, cpu_node_zygote, tmp_path)
    assert _verdict(sim) == ["completed"] * 2
    _scrub(_HF_TIMES, r"'train_\1': _", sim, real)
    assert differences(sim, real) == []
    assert [_ops(sim, r) for r in (0, 1)] == [[], []]
    assert all("'train_loss': " in sim.ranks[r].output[-1] for r in (0, 1))
    here = tmp_path / "torchrun"
    here.mkdir()
    done, lines = torchrun(script, args, here)
    assert done.returncode == 0, done.stderr[-2000:]
    assert sum("'train_loss': " in line for line in lines) == 2
