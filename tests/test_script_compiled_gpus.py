"""`torch.compile` of a model on the simulated GPUs, under DDP as nanoGPT's `--compile=True`
runs it: the same program simulated and on real Gloo must agree (`simdist compare`), and
compiled it must train to the values the uncompiled model does."""

from __future__ import annotations

import pytest

from simdist.script import run_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT, descendants
from tests.test_script_examples import _verdict, differences
from tests.test_script_modern_apis import _both
from tests.test_script_user_idioms import _keyed

SCRIPTS = ROOT / "tests" / "scripts"


def test_dynamo_starts_no_frame_in_the_rank_layer_and_inlines_its_moves():
    """`rank/boot._on_dynamo`: every file of simdist is skipped as a frame of its own (a frame
    dynamo compiled in the rank layer broke compiled DDP on simulated GPUs), and the files
    compiled code calls (the `CudaToCpu` mode, the moves, the torch.cuda shims) are still
    traced when called (skipping them would make each a graph break). In-process, restored."""
    from torch._dynamo import trace_rules

    from simdist.script.rank import boot, devices, gpu_shims, pg

    skip_dirs, inlined = list(trace_rules.SKIP_DIRS), set(trace_rules.BUILTIN_INLINE_WHEN_CALLED)
    try:
        boot._on_dynamo(None)
        for module in (devices, gpu_shims, pg, boot):
            assert trace_rules.check_file(module.__file__, is_inlined_call=False).skipped, module
        for module in (devices, gpu_shims):
            assert not trace_rules.check_file(module.__file__, is_inlined_call=True).skipped, module
        assert trace_rules.check_file(pg.__file__, is_inlined_call=True).skipped
    finally:
        trace_rules.SKIP_DIRS[:] = skip_dirs
        trace_rules.BUILTIN_INLINE_WHEN_CALLED.clear()
        trace_rules.BUILTIN_INLINE_WHEN_CALLED.update(inlined)
        trace_rules._recompile_re()


def _under_its_own_backend(script: str, zygote, *args: str):
    """A simulated run with the semantics of the backend the script asks for (NCCL for a GPU
    script's `init_process_group("nccl")`), as `simdist run` gives it; `compare` runs Gloo's."""
    run_id, z = new_run_id(), zygote("sim")
    report = run_script(SCRIPTS / script, list(args), nproc_per_node=2, backend=None, mode="sim", timeout_s=300,
                        run_id=run_id, measure_compute=False, zygote=z)
    assert tagged_processes(run_id) == [] and descendants(z.pid) == []
    return report


@pytest.mark.real
@pytest.mark.parametrize(("first", "wrap"), [
    ("eager", "ddp"), ("aot_eager", "ddp"),
    pytest.param("inductor", "ddp", marks=pytest.mark.slow),
    pytest.param("inductor", "none", marks=pytest.mark.slow)])
def test_compiled_model_on_the_gpus_agrees_and_trains_as_uncompiled(script_zygote, first, wrap):
    """tests/scripts/compiled_ddp_gpus.py: DDP(device_ids=[rank]) of a model on `cuda:rank` (or,
    `--wrap none`, the model with its gradients all-reduced by hand), then
    `torch.compile(model, backend=first)`, three steps, then the same model uncompiled, in one
    process per rank: on real Gloo and simulated they agree, and simulated with the script's
    own "nccl" (as `simdist run` runs it) the ranks print the same lines.

    Before, compiled DDP failed in the second forward with any backend ("a tensor of dtype 5
    is not supported", under "nccl"): DDP's `_pre_forward` runs eagerly under dynamo's frame
    hook, dynamo compiled the rank layer's `CudaToCpu.__torch_function__` as a frame of its
    own, and the bucket-rebuild broadcast's tensor read its dtype as its length
    (`rank/boot._on_dynamo`); in the first compiled DDP model of a process only, hence one
    run per backend. Inductor (`torch.compile`'s default, nanoGPT's) failed on both sides:
    its cache key read the device's `gcnArchName` (`gpu_props.DeviceProperties` lacked it),
    and with no cached graph its pattern matchers made CUDA tensors ("PyTorch is not linked
    with support for cuda devices"; `gpu_shims.is_available` tells inductor False). Slow:
    inductor compiles C++ kernels on each rank."""
    args = ("--variants", first, "uncompiled", "--wrap", wrap)
    sim, real = _both("compiled_ddp_gpus.py", 2, script_zygote, *args)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    own = _under_its_own_backend("compiled_ddp_gpus.py", script_zygote, *args)
    assert _verdict(own) == ["completed"] * 2
    checksums = set()
    for rank in (0, 1):
        got = _keyed(sim.ranks[rank].output)
        assert _keyed(own.ranks[rank].output) == got
        assert got[first] == got["uncompiled"]
        assert got[first].endswith(f" on cuda:{rank}")
        checksums.add(got[first].split(" checksum ")[1].split()[0])
    assert len(checksums) == 1  # the replicas stayed equal


@pytest.mark.real
@pytest.mark.slow
def test_what_an_inductor_graph_returns_is_on_the_gpu(script_zygote):
    """tests/scripts/compiled_outputs_gpus.py: a model and a loss function compiled by inductor
    on `cuda:rank`, under no_grad and with gradients: simulated and on real Gloo they agree,
    and each rank prints what the uncompiled program prints (as on a GPU, where compiling
    moves nothing): the output and the loss on `cuda:rank`, `.numpy()` of the loss refused,
    the memory they hold counted. Before, what inductor's own kernels wrote (the loss) was
    host memory to the script: "loss on cpu", `.numpy()` allowed, 512 bytes uncounted
    (`rank/inductor_outputs`). Slow: inductor compiles C++ kernels on each rank."""
    sim, real = _both("compiled_outputs_gpus.py", 2, script_zygote)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    plain = _under_its_own_backend("compiled_outputs_gpus.py", script_zygote, "--backend", "uncompiled")
    for rank in (0, 1):
        got = _keyed(sim.ranks[rank].output)
        assert got == _keyed(plain.ranks[rank].output)
        assert got["no_grad"] == f"out on cuda:{rank}, loss on cuda:{rank}, numpy refused holding 1024 bytes"
        assert got["total"].endswith(f" on cuda:{rank}")
