"""What users' own training scripts do beyond the collectives: functional collectives, the
launcher's elastic environment, and the GPU idioms the rank layer models on a CPU machine
(`torch.accelerator`, CUDA generator state, host/device copies, `torch.compile`).

The scripts run once simulated and once on real Gloo and must agree as `simdist compare`
judges them (tests/test_script_examples.py). The GPU idioms are modelled on both sides alike
(real Gloo's ranks get the same remap), so a comparison cannot see them: what a GPU would do
is asserted on the printed lines, and the patches are checked in-process too."""

from __future__ import annotations

import pytest

from tests.test_script_examples import _run, _verdict, differences
from tests.test_script_modern_apis import _both


@pytest.mark.real
def test_functional_collectives_agree_with_real_gloo(script_zygote):
    """tests/scripts/functional_collectives.py: all_reduce (a group as WORLD, a mesh, a list of
    ranks), all_gather_tensor, reduce_scatter_tensor, all_to_all_single, broadcast and
    all_reduce_coalesced of torch.distributed._functional_collectives, values bit for bit."""
    sim, real = _both("functional_collectives.py", 3, script_zygote)
    assert _verdict(sim) == ["completed"] * 3
    assert differences(sim, real) == []
    out = sim.ranks[1].output
    assert out[0].startswith("[rank1] sum [3.0, 6.0, 9.0, 12.0] gathered [0.0, 1.0, 2.0, 3.0, 1.0,")
    assert "rs [6.0, 6.0] max [4.0, 6.0, 8.0, 10.0] a2a [1.0, 11.0, 21.0] bcast [2.0, 3.0, 4.0, 5.0]" in out[0]
    assert out[1] == "[rank1] coalesced [[3.0, 6.0, 9.0, 12.0], [9.0, 18.0, 27.0, 36.0]]"


@pytest.mark.real
def test_elastic_environment_and_backend_queries_agree_with_real_gloo(script_zygote):
    """tests/scripts/elastic_env.py: LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, the elastic run
    id, is_torchelastic_launched(), get_backend() of the world and of a node's subgroup (the
    script asks for nccl: `compare` runs Gloo's semantics), init_process_group(device_id=int)."""
    sim, real = _both("elastic_env.py", 2, script_zygote)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert sim.ranks[1].output == [
        "[rank1] local 1/2 group_rank 0 role_rank 1 node 0 backend gloo",
        "[rank1] intra backend gloo size 2 rank-in-group 1 global-of-0 0",
        "[rank1] node sum 1.0 device-type-of-result cuda"]  # a GPU tensor, as on a GPU (`rank.device_view`)


@pytest.mark.real
def test_host_device_copies_are_copies_on_both_sides(script_zygote):
    """tests/scripts/cuda_copies.py: a batch sliced from host data and normalised in place
    after `.to("cuda")`, a reused staging buffer, predictions clipped in place after
    `.cpu().numpy()`: on a GPU each move is a new tensor, so the host data is unchanged; the
    simulated GPUs print what a GPU run does (before: the host data changed, every staged
    batch was the last one)."""
    sim, real = _both("cuda_copies.py", 2, script_zygote)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert sim.ranks[1].output[:4] == [
        "[rank1] host data unchanged True",
        "[rank1] staged [1.0, 2.0, 3.0] same tensor False",
        "[rank1] preds on device after clipping a host copy [-1.0, 2.0, -3.0]",
        "[rank1] device->device move is a no-op True"]
    assert sim.ranks[1].output[4].startswith("[rank1] device generator draws [")  # it failed: no CUDA generator


def _keep(monkeypatch, *owners, inherited: tuple[str, ...] = ()) -> None:
    """Restore every public attribute of `owners` after the test (the patches set them), and
    the `inherited` ones: a method a class inherits (`Tensor.to` is `TensorBase`'s) is not in
    its `vars`, so a patch that sets it on the class must be deleted again, or every later
    test of the worker runs with the rank layer's moves."""
    for owner in owners:
        for name in [n for n in vars(owner) if not n.startswith("__")]:
            monkeypatch.setattr(owner, name, getattr(owner, name))
        for name in inherited:
            monkeypatch.setattr(owner, name, getattr(owner, name))  # (undone: deleted from the class)


def test_moves_copy_where_a_gpu_copies(monkeypatch):
    """`rank.devices`: a host tensor moved to CUDA is a new tensor (autograd sees a copy: not a
    leaf), a tensor made on or moved to a simulated GPU moves there again as itself and to
    another GPU as a copy, `.cpu()` of it is a copy; a module moved to CUDA keeps its
    parameters (same objects) with new memory on the GPU, as `Module._apply` gives them there,
    and they move as themselves; `.numpy()` of a GPU tensor raises torch's error. In-process,
    restored."""
    import torch

    from simdist.script.rank import device_args, devices

    _keep(monkeypatch, torch.Tensor, inherited=("to", "cuda", "cpu", "numpy", "pin_memory"))
    _keep(monkeypatch, torch.nn.Module)
    devices._patch_tensor_moves()
    devices._patch_module_to()
    host = torch.arange(4.0)
    dev = host.to("cuda:1")
    assert dev is not host and dev.data_ptr() != host.data_ptr() and device_args.stands_for_gpu(dev)
    assert dev.to("cuda:1") is dev and dev.cuda(1) is dev and dev.to(device=1) is dev
    assert dev.cuda() is not dev and dev.to("cuda:0").data_ptr() != dev.data_ptr()  # current device 0: a copy
    assert host.cuda() is not host and host.to(torch.float64) is not host and host.to("cpu") is host
    back = dev.cpu()
    assert back is not dev and back.data_ptr() != dev.data_ptr() and not device_args.stands_for_gpu(back)
    assert dev.to("cpu") is not dev and dev.to("cpu", copy=False).data_ptr() != dev.data_ptr()
    with pytest.raises(TypeError, match=r"can't convert cuda:1 device type tensor to numpy"):
        dev.numpy()
    assert dev.numpy(force=True).tolist() == host.numpy().tolist() == [0.0, 1.0, 2.0, 3.0]
    leaf = torch.ones(2, requires_grad=True)
    assert not leaf.to("cuda").is_leaf  # as on a GPU: the moved tensor has a grad_fn
    made = torch.zeros(2)
    assert made.to("cuda") is not made
    lin = torch.nn.Linear(2, 2)
    weight, ptr = lin.weight, lin.weight.data_ptr()
    lin.to("cuda")
    assert lin.weight is weight and lin.weight.data_ptr() != ptr and lin.weight.to("cuda") is lin.weight
    on_gpu = lin.weight.data_ptr()
    lin.cuda(0)
    assert lin.weight.data_ptr() == on_gpu
    lin.cpu()
    assert lin.weight is weight and lin.weight.data_ptr() != on_gpu and not device_args.stands_for_gpu(lin.weight)


def test_as_tensor_on_cuda_copies_host_data():
    """`torch.as_tensor`/`torch.asarray(..., device="cuda")` of host data (a NumPy array, a host
    tensor) is a copy on a GPU; placed on the CPU it was the host data itself (and the host
    tensor was marked as standing for a GPU one), so an in-place edit of the "device" batch
    changed the host array. Of a tensor that stands for a GPU one it is that tensor's memory,
    as on a GPU. In-process, under the rank layer's mode."""
    import numpy as np
    import torch

    from simdist.script.rank import device_args, devices

    arr, host = np.zeros(3, dtype=np.float32), torch.zeros(3)
    with devices.CudaToCpu():
        a = torch.as_tensor(arr, device="cuda")
        h = torch.asarray(host, device="cuda:0")
        again = torch.as_tensor(h, device="cuda")
        listed = torch.as_tensor([1.0, 2.0], device="cuda")
    a.add_(1)
    h.add_(1)
    assert arr.tolist() == [0.0] * 3 and host.tolist() == [0.0] * 3 and not device_args.stands_for_gpu(host)
    assert device_args.stands_for_gpu(h) and again.data_ptr() == h.data_ptr() and device_args.stands_for_gpu(listed)


def test_as_tensor_on_the_host_of_a_gpu_tensor_copies_it():
    """`torch.as_tensor`/`torch.asarray(gpu_tensor, device="cpu")` is a host copy on a GPU
    (the memory moves device); placed on the CPU it was the GPU tensor itself, so `.numpy()`
    of the "host" result raised and an edit of it changed the GPU tensor; placed on another
    GPU, it moved the tensor's own memory there. In-process, under the rank layer's mode."""
    import torch

    from simdist.script.rank import device_args, devices

    with devices.CudaToCpu():
        g = torch.ones(3, device="cuda")
        a = torch.as_tensor(g, device="cpu")
        b = torch.asarray(g, device=torch.device("cpu"), copy=False)
        host = torch.zeros(2)
        same = torch.as_tensor(host, device="cpu")
    a.add_(1)
    b.add_(2)
    assert g.tolist() == [1.0] * 3 and not device_args.stands_for_gpu(a) and not device_args.stands_for_gpu(b)
    assert same is host  # a host tensor placed on the host is itself, as in torch
    with devices.CudaToCpu():
        other = torch.as_tensor(g, device="cuda:1")  # another GPU: a copy there, `g` stays on GPU 0
    assert g.untyped_storage()._simdist_cuda_index == 0 and other.untyped_storage()._simdist_cuda_index == 1
    assert other.data_ptr() != g.data_ptr()


def test_a_host_scalar_tensor_leading_a_gpu_operation_gives_a_gpu_result():
    """CUDA lets a 0-dim host tensor join a device operation, in any place, and the result is
    on the device (`scale * grad`, `torch.maximum(floor, x)`); the mode read the device off
    the first tensor alone, so such a result was host memory (`.numpy()` of it worked where a
    GPU raises). A host scalar with host tensors stays on the host. In-process."""
    import torch

    from simdist.script.rank import device_args, devices

    with devices.CudaToCpu():
        g = torch.ones(3, device="cuda:1")
        scale = torch.tensor(2.0)
        led = scale * g
        floor = torch.maximum(scale, g)
        host = scale * torch.ones(3)
    assert device_args.stands_for_gpu(led) and device_args.stands_for_gpu(floor) and not device_args.stands_for_gpu(host)
    assert led.untyped_storage()._simdist_cuda_index == 1


def test_a_cuda_default_device_places_factories_on_the_simulated_gpu(monkeypatch):
    """`with torch.device("cuda"):` / `torch.set_default_device("cuda")` (a model built on the
    GPU, as torchtitan does): torch's DeviceContext, at the bottom of the mode stack, gave the
    factories `device="cuda"` after the rank layer's mode had passed them, and they raised
    "Torch not compiled with CUDA enabled". In-process, restored."""
    import torch
    import torch.utils._device as ud

    from simdist.script.rank import device_args, devices

    monkeypatch.setattr(ud.DeviceContext, "__torch_function__", ud.DeviceContext.__torch_function__)
    devices._patch_device_context()
    with devices.CudaToCpu(), torch.device("cuda:1"):
        lin = torch.nn.Linear(2, 2)
        made = torch.zeros(3)
        host = torch.ones(2, device="cpu")
    assert device_args.stands_for_gpu(made) and device_args.stands_for_gpu(lin.weight) and not device_args.stands_for_gpu(host)
    assert made.untyped_storage()._simdist_cuda_index == 1


def test_torch_accelerator_and_cuda_rng_report_the_simulated_gpus(monkeypatch):
    """`rank.gpu_shims`: torch.accelerator says what torch.cuda says (it said "no
    accelerator" while torch.cuda said 8 GPUs), and CUDA's generator state is the CPU
    generator's (torch.compile saves and restores it whenever CUDA is available; it raised
    "Torch not compiled with CUDA enabled"). In-process, restored."""
    import torch
    import torch.accelerator
    import torch.cuda.random

    from simdist.script.rank import cuda_init, gpu_shims

    _keep(monkeypatch, torch.cuda, torch.cuda.random, torch.cuda.nvtx, torch.cuda.nccl, torch.accelerator, gpu_shims._Gpus,
          cuda_init._Init)
    gpu_shims.install(4)
    acc = torch.accelerator
    assert acc.is_available() and acc.current_accelerator() == torch.device("cuda") and acc.device_count() == 4
    acc.set_device_index(2)
    assert acc.current_device_index() == torch.cuda.current_device() == 2
    with acc.device_index(3):
        assert acc.current_device_index() == 3
    assert acc.current_device_index() == 2
    assert not acc.current_stream().is_capturing()  # an optimizer's step asks
    torch.manual_seed(7)
    state = torch.cuda.get_rng_state()
    first = torch.rand(3)
    torch.cuda.set_rng_state(state)
    assert torch.equal(torch.rand(3), first)
    assert torch.cuda.initial_seed() == 7


@pytest.mark.real
def test_fsdp2_on_a_cuda_mesh_agrees_with_real_gloo(script_zygote):
    """tests/scripts/fsdp2_cuda_mesh.py: FSDP2 on init_device_mesh("cuda") with the model on
    cuda asserted "Expects the parameter to already be moved to device cuda:0 but got cpu" on
    both sides; its shards are now on the CPU (`wrapper_devices.place_fsdp2_on_cpu`): bf16 mixed
    precision, activation checkpointing, clip_grad_norm_ and a full state dict, bit for bit."""
    sim, real = _both("fsdp2_cuda_mesh.py", 2, script_zygote)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    out = sim.ranks[0].output
    assert sum(line.startswith("[rank0] step ") for line in out) == 3
    assert out[-1].startswith("[rank0] full state dict 14 tensors, head ")


@pytest.mark.real
def test_fsdp2_meta_initialisation_on_a_cuda_mesh_agrees_with_real_gloo(script_zygote):
    """tests/scripts/fsdp2_cuda_mesh.py --meta: FSDP2 on a meta-device model, `to_empty(device=
    "cuda")` then `reset_parameters()`, reaches DTensor's random ops on a "cuda" mesh: its
    sharding propagation made fake CUDA tensors ("PyTorch is not linked with support for cuda
    devices") and its RNG region wrote a Philox offset into the CPU generator's state; both run
    on the CPU now (`gpu_shims.place_dtensor_meta_on_cpu`, `place_dtensor_rng_on_cpu`), and the
    run agrees with real Gloo (before: refused as a CUDA-only operation)."""
    sim, real = _both("fsdp2_cuda_mesh.py", 2, script_zygote, "--meta")
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    assert sum(line.startswith("[rank0] step ") for line in sim.ranks[0].output) == 3


@pytest.mark.real
def test_a_cuda_only_path_is_refused_and_named(script_zygote):
    """A CUDA-only call the simulated GPUs lack (tests/scripts/cuda_only_call.py: the legacy
    `torch.cuda.FloatTensor(4)`): the run is bad input naming the CUDA-only operation, the rank
    and the user's line (the CLI: one line, exit 2, the rank prints no traceback: `rank.exits`)."""
    from simdist.errors import ScriptError
    from simdist.script import run_script
    from tests.conftest import ROOT

    with pytest.raises(ScriptError, match=r"script: a CUDA-only operation on the simulated GPUs \(Torch not compiled "
                                          r"with CUDA enabled\) is not supported by the simulated backend \(rank \d at "
                                          r"cuda_only_call.py:\d+ in main: buf = torch.cuda.FloatTensor\(4\).zero_\(\)\)"):
        run_script(ROOT / "tests" / "scripts" / "cuda_only_call.py", [], nproc_per_node=2, backend="gloo",
                   timeout_s=120, measure_compute=False, zygote=script_zygote("sim"))


def test_cuda_only_errors_are_unsupported_operations():
    """`env.unsupported_in`: torch's errors for a CUDA-only path are the simulated GPUs' gap."""
    from simdist.script import env

    assert env.unsupported_in("RuntimeError: Torch not compiled with CUDA enabled") == (
        "a CUDA-only operation on the simulated GPUs (Torch not compiled with CUDA enabled)")
    assert env.unsupported_in("PyTorch is not linked with support for cuda devices\n\nSharding propagation failed")
    assert env.unsupported_in(env.UNSUPPORTED.format("a tensor of dtype uint16")) == "a tensor of dtype uint16"
    assert env.unsupported_in("Cannot get CUDA generator without ATen_cuda library. PyTorch splits ...")
    assert env.unsupported_in("Connection closed by peer") is None


def test_a_generator_made_on_cuda_is_a_cpu_generator(monkeypatch):
    """`torch.Generator(device="cuda:1")` is a CPU generator (CUDA's failed), and every
    generator, torch's default one too, is still an instance of `torch.Generator`."""
    import torch

    from simdist.script.rank import devices

    monkeypatch.setattr(torch, "Generator", torch.Generator)
    devices._patch_generator()
    g = torch.Generator(device="cuda:1").manual_seed(3)
    assert g.device == torch.device("cpu") and isinstance(g, torch.Generator)
    assert isinstance(torch.default_generator, torch.Generator) and torch.Generator().device.type == "cpu"
    assert torch.equal(torch.randperm(6, generator=g), torch.randperm(6, generator=torch.Generator().manual_seed(3)))


def _keyed(lines: list[str]) -> dict[str, str]:
    """`[rankN] key: value` lines (tests/scripts/gpu_snapshots.py) by key."""
    return dict(line.split("] ", 1)[1].split(": ", 1) for line in lines)


@pytest.mark.real
def test_weight_snapshots_of_a_gpu_model_are_snapshots(script_zygote):
    """tests/scripts/gpu_snapshots.py on the simulated GPUs against the same program on the
    CPU (`--device cpu`). torch's semantics: `.cpu()` of a CUDA tensor is a copy in host memory,
    of a CPU tensor the tensor itself (torch/_tensor_docs.py "cpu"; `.numpy()` of a CUDA tensor
    raises, torch/csrc/utils/tensor_numpy.cpp). So where they coincide (losses, weights,
    `copy.deepcopy(model.state_dict())`, `p.data.clone()`, `to_empty(device="cuda")` then
    `load_state_dict`, `.item()`, `.tolist()`, `copy_`) the lines are equal, and where they
    differ the GPU run shows snapshots: `{k: v.cpu() for k, v in model.state_dict().items()}`
    keeps the epoch-0 weights (on main it followed the training, as the CPU run's does), so
    do `.cpu()` of a `to_empty` parameter and of a slice; `print` shows `device='cuda:N'`."""
    sim, real = _both("gpu_snapshots.py", 2, script_zygote)
    cpu = _run({"script": "../tests/scripts/gpu_snapshots.py", "nproc": 2, "args": ["--device", "cpu"]}, "sim",
               script_zygote)
    assert _verdict(sim) == _verdict(cpu) == ["completed"] * 2
    assert differences(sim, real) == []
    same = ("loss0", "final", "deepcopy", "clone", "restored", "to_empty_loaded", "item_tolist_copy")
    for rank in (0, 1):
        gpu, host = _keyed(sim.ranks[rank].output), _keyed(cpu.ranks[rank].output)
        assert {k: gpu[k] for k in same} == {k: host[k] for k in same}
        assert gpu["state_dict_cpu"] == gpu["deepcopy"] == gpu["restored"] != gpu["final"]
        assert host["state_dict_cpu"] == host["final"] and host["moved_since_cpu_snapshot"] == "0.0000"
        assert float(gpu["moved_since_cpu_snapshot"]) > 0
        loaded = gpu["to_empty_loaded"].strip("[]").split(", ")
        assert gpu["to_empty_cpu_after_update"] == "[" + ", ".join(loaded[:3]) + "]"
        assert host["to_empty_cpu_after_update"] != gpu["to_empty_cpu_after_update"]
        assert gpu["slice_cpu_after_update"] == "[2.0, 3.0, 4.0]" != host["slice_cpu_after_update"]
        device = f", device='cuda:{rank}')"
        assert gpu["printed"] == host["printed"][:-1] + device
        assert gpu["loss_printed"] == host["loss_printed"][:-1] + device
        assert gpu["numpy"] == (f"TypeError: can't convert cuda:{rank} device type tensor to numpy. Use "
                                "Tensor.cpu() to copy the tensor to host memory first.")
        assert host["numpy"].startswith("[0.0, ")


def test_the_simulated_device_is_the_storages(monkeypatch):
    """`rank.gpu_memory`: every alias of a GPU tensor's memory is on the GPU (`p.data`,
    `detach()`, a `state_dict()` value, a slice), and so are the results of torch calls on
    one (a model's output, `clone()`, `copy.deepcopy`, the gradient read as `p.grad`), while an
    in-place op on a host tensor, a host factory and `.cpu()` stay on the host; `print` shows
    the device as a GPU run does. In-process, under the rank layer's mode, restored."""
    import copy

    import torch
    import torch._tensor_str

    from simdist.script.rank import device_args, devices, gpu_memory

    _keep(monkeypatch, torch.Tensor, inherited=("to", "cuda", "cpu", "numpy", "pin_memory"))
    _keep(monkeypatch, torch.nn.Module)
    _keep(monkeypatch, torch._tensor_str)  # (its `_str_intern` and `_add_suffixes` too)
    devices._patch_tensor_moves()
    devices._patch_module_to()
    gpu_memory.install_repr()
    with devices.CudaToCpu():
        lin = torch.nn.Linear(3, 2).to("cuda:1")
        out = lin(torch.ones(4, 3).cuda(1))
        out.sum().backward()
        aliases = [lin.weight.data, lin.weight.detach(), lin.state_dict()["weight"], lin.weight[0, 1:]]
        made = [out, lin.weight.clone(), copy.deepcopy(lin.state_dict())["bias"], lin.weight.grad]
        host = torch.zeros(3)
        host.add_(torch.ones(3, device="cuda:1")[0])
        assert [gpu_memory.gpu_index(t) for t in aliases + made] == [1] * 8
        assert not device_args.stands_for_gpu(host) and not device_args.stands_for_gpu(lin.weight.cpu())
        snapshot = {k: v.cpu() for k, v in lin.state_dict().items()}
        with torch.no_grad():
            lin.weight.add_(1)
        assert not torch.equal(snapshot["weight"], lin.weight.detach().cpu())
        assert repr(torch.arange(2.0, device="cuda:1")) == "tensor([0., 1.], device='cuda:1')"
        assert repr(torch.arange(2.0)) == "tensor([0., 1.])"


@pytest.mark.real
def test_gpu_tensors_keep_their_device_through_pickling(script_zygote):
    """tests/scripts/gpu_pickling.py: a GPU tensor pickled comes back on the GPU it was pickled
    from, as on a GPU (torch's `_tensor_to_object` unpickles with no `map_location`): through
    `all_gather_object` (rank 0 gets rank 1's tensor on cuda:1), `broadcast_object_list`,
    `torch.save`/`torch.load` and plain `pickle`; a `.cpu()` copy and `map_location="cpu"`
    give host memory. Before, every one printed host memory (`tensor([1.])`)."""
    sim, real = _both("gpu_pickling.py", 2, script_zygote)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    for rank in (0, 1):
        got, here = _keyed(sim.ranks[rank].output), f"device='cuda:{rank}'"
        assert got["all_gather_object"] == ("[(\"tensor([0.], device='cuda:0')\", 'tensor([0.])'), "
                                            "(\"tensor([1.], device='cuda:1')\", 'tensor([1.])')]")
        assert got["broadcast_object_list"] == "tensor([10.], device='cuda:0')"
        assert got["torch_load"] == f"(\"tensor([{rank}.], {here})\", \"tensor([{rank}.], {here})\")"
        assert got["torch_load_cpu"] == f"tensor([{rank}.])"
        assert got["pickle"] == f"tensor([{2 * rank}.], {here})"
        assert got["numpy"].startswith(f"TypeError: can't convert cuda:{rank} device type tensor to numpy.")


def test_a_simulated_gpu_checkpoint_is_a_cuda_checkpoint(monkeypatch):
    """`gpu_memory.location_tag` tags a simulated GPU's storage `cuda:N` (host storages stay
    "cpu"), so a file saved in a rank is a CUDA checkpoint: torch outside simdist (no remap, no
    GPU) refuses it without `map_location`, as it refuses a real one, and reads it with
    `map_location="cpu"`. In-process, torch's registry restored."""
    import io
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.serialization

    from simdist.script.rank import gpu_memory

    monkeypatch.setattr(torch.serialization, "_package_registry", list(torch.serialization._package_registry))
    monkeypatch.setattr(ForkingPickler, "_extra_reducers", dict(ForkingPickler._extra_reducers))
    _keep(monkeypatch, torch._tensor_str)
    gpu_memory.install()
    gpu, host = gpu_memory.mark(torch.arange(3.0), 1), torch.ones(2)
    assert torch.serialization.location_tag(gpu.untyped_storage()) == "cuda:1"
    assert torch.serialization.location_tag(gpu[1:]._typed_storage()) == "cuda:1"
    assert torch.serialization.location_tag(host.untyped_storage()) == "cpu"
    buf = io.BytesIO()
    torch.save({"gpu": gpu, "host": host}, buf)
    monkeypatch.undo()  # torch as outside simdist
    buf.seek(0)
    with pytest.raises(RuntimeError, match="deserialize object on a CUDA device"):
        torch.load(buf)
    buf.seek(0)
    loaded = torch.load(buf, map_location="cpu")
    assert loaded["gpu"].tolist() == [0.0, 1.0, 2.0] and gpu_memory.gpu_index(loaded["gpu"]) is None


def test_a_gpu_tensor_through_a_multiprocessing_queue_stays_on_its_gpu(monkeypatch):
    """An `mp.Queue`/`Pipe` pickles a tensor with torch's `reduce_tensor` (shared host memory
    rebuilt on the other side: host memory there); on a GPU the receiver gets a tensor on the
    sender's device (CUDA IPC), and so it does here (`gpu_memory.rebuild_on_gpu`). Torch's
    sender-side cache is emptied so that the rebuild is the other process's (a new storage on
    the same shared memory). In-process, ForkingPickler's reducers restored."""
    from multiprocessing.reduction import ForkingPickler

    import torch
    import torch.multiprocessing.reductions as reductions

    from simdist.script.rank import gpu_memory

    monkeypatch.setattr(ForkingPickler, "_extra_reducers", dict(ForkingPickler._extra_reducers))

    def send(t: torch.Tensor) -> torch.Tensor:
        sent = ForkingPickler.dumps(t)
        reductions.shared_cache.clear()
        return ForkingPickler.loads(sent)

    assert gpu_memory.gpu_index(send(gpu_memory.mark(torch.arange(3.0), 1))) is None  # torch's own: host memory
    gpu_memory._install_sharing()
    got = send(gpu_memory.mark(torch.arange(3.0), 1))
    param = send(gpu_memory.mark(torch.nn.Parameter(torch.ones(2)), 0))
    assert got.tolist() == [0.0, 1.0, 2.0] and gpu_memory.gpu_index(got) == 1
    assert type(param) is torch.nn.Parameter and gpu_memory.gpu_index(param) == 0
    assert gpu_memory.gpu_index(send(torch.ones(2))) is None


_REINIT = ("RuntimeError: Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, "
           "you must use the 'spawn' start method")


@pytest.mark.real
def test_cuda_in_a_forked_child_raises_as_torch_does(script_zygote):
    """tests/scripts/cuda_fork.py. There is no GPU here, so what a GPU run prints is taken from
    torch's source: `torch._C._cuda_init` and `_cuda_getDeviceCount` (behind
    `torch.cuda.is_available()`) register a pthread_atfork child handler
    (torch/csrc/cuda/Module.cpp `poison_fork`, torch/csrc/utils/device_lazy_init.cpp
    `register_fork_handler_for_device_init`); in a child forked after that,
    `_cuda_isInBadFork()` is true (asked directly too, as Accelerate does) and the first CUDA use goes through `torch.cuda._lazy_init`,
    which raises `_REINIT` (torch/cuda/__init__.py), while `is_available()`/`device_count()`
    answer and `is_initialized()` is False. So: a child forked before any of it uses its GPU,
    one forked after `is_available()` or after `set_device` raises on `.cuda()`, a factory's
    `device="cuda"`, `set_device`, `current_device`; so does an `os.fork` child, and a
    DataLoader whose workers' collate calls `.cuda()` re-raises it in the rank
    (torch/utils/data/_utils ExceptionWrapper: "Caught RuntimeError in DataLoader worker
    process 0."), and a GPU tensor a forked child receives through a queue raises it there
    (torch/multiprocessing/reductions.py `rebuild_cuda_tensor` calls `_lazy_init`); pinned
    batches from workers and a spawned child (which gets the tensor on the sender's GPU) are
    fine. Before, every child used its GPU. Both sides run the same rank layer: they must
    agree."""
    sim, real = _both("cuda_fork.py", 2, script_zygote)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    for rank in (0, 1):
        got = _keyed(sim.ranks[rank].output)
        assert got["fork before CUDA"] == "[('cuda', 'ok 2.0')]"
        assert got["fork after is_available"] == f"[('queries', 'ok (True, True, True, True, False)'), ('cuda', \"{_REINIT}\")]"
        after = [f"('{use}', \"{_REINIT}\")" for use in ("cuda", "factory", "set_device", "current_device")]
        assert got["fork after init"] == (f"[{', '.join(after)}, ('queries', 'ok (True, True, True, True, False)'), "
                                          f"('receive', \"{_REINIT}\")]")
        assert got["os.fork after init"] == _REINIT
        assert got["collate to gpu"] == f"RuntimeError: Caught RuntimeError in DataLoader worker process 0. ... {_REINIT}"
        assert got["pinned batches"] == "[([0.0, 1.0, 2.0, 3.0], 6.0), ([4.0, 5.0, 6.0, 7.0], 22.0)]"
        assert got["spawn after init"] == f"[('cuda', 'ok 2.0'), ('receive', 'ok cuda:{rank}')]"
        assert got["all_reduce"] == "[3.0, 3.0]"


@pytest.mark.real
def test_a_gpu_tensors_device_reads_as_on_a_gpu(script_zygote):
    """tests/scripts/gpu_device_reads.py: the script's own reads of a simulated GPU tensor's
    device say what a GPU run's do (`rank.device_view`): `cuda:N`, `is_cuda`, `get_device()`
    N, `type()` "torch.cuda.FloatTensor", a model's `next(parameters()).device`; so
    `torch.zeros(n, device=x.device)` and `batch.to(x.device)` are GPU tensors,
    `x.to(x.device)` is `x` (torch's `to` returns self when nothing changes), and the GPU
    branch of `x.device.type == "cuda"` is taken. Before, each said `cpu`: the two tensors
    were host tensors, `x.to(x.device)` a host copy, the CPU branch taken."""
    sim, real = _both("gpu_device_reads.py", 2, script_zygote)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    for rank in (0, 1):
        got, cuda = _keyed(sim.ranks[rank].output), f"device(type='cuda', index={rank})"
        assert got["device"] == f"({cuda}, 'cuda:{rank}', 'cuda', {rank})"
        assert got["flags"] == f"(True, False, {rank}, 'torch.cuda.FloatTensor')"
        assert got["model device"] == f"cuda:{rank}"
        assert got["placed by x.device"] == (f"(\"tensor([0., 0.], device='cuda:{rank}')\", "
                                             f"\"tensor([0., 1.], device='cuda:{rank}')\", True)")
        assert got["output and grad"] == f"({cuda}, {cuda}, device(type='cpu'))"
        assert got["grad norm device"] == f"cuda:{rank}"  # was a host tensor: torch read the CPU off grads[0]
        assert got["branch"] == "gpu branch"
        assert got["prefetched"] == f"tensor([0., 1., 2.], device='cuda:{rank}')"  # record_stream raised
        assert got["compiled"] == "[2.0, 2.0, 2.0]"  # dynamo raised: device_view.host_index is skipped code
        assert got["fsdp2 param"] == f"('DTensor', 'cuda:{rank}', True, {cuda})"  # was 'cpu', False: host inputs
        assert got["all_reduce"] == f"tensor(6., device='cuda:{rank}')"


def test_torchs_own_code_reads_the_memorys_device(monkeypatch):
    """`rank.device_view`: who asks decides. The program's code (this test module) reads a
    simulated GPU tensor as `cuda:1`; code whose module is torch's reads the CPU its memory is
    on (torch picks its CPU kernels and checks by it), as does anyone for a host tensor; what
    torch's code places on the device it read off a GPU tensor is on that GPU, as on a GPU.
    In-process, restored."""
    import torch

    from simdist.script.rank import device_view, devices, gpu_memory

    _keep(monkeypatch, torch.Tensor, inherited=("device", "is_cuda", "is_cpu", "get_device", "type", "to", "cuda",
                                                "cpu", "numpy", "pin_memory"))
    device_view.install()
    devices._patch_tensor_moves()
    gpu, host = gpu_memory.mark(torch.zeros(2), 1), torch.zeros(2)
    internal: dict = {"__name__": "torch.nn.fake_internal"}
    exec("def read(t): return (t.device, t.is_cuda, t.is_cpu, t.get_device(), t.type())", internal)
    assert (gpu.device, gpu.is_cuda, gpu.is_cpu, gpu.get_device(), gpu.type()) == (
        torch.device("cuda", 1), True, False, 1, "torch.cuda.FloatTensor")
    assert internal["read"](gpu) == internal["read"](host) == (torch.device("cpu"), False, True, -1, "torch.FloatTensor")
    assert (host.device, host.is_cuda, host.get_device()) == (torch.device("cpu"), False, -1)
    assert gpu[:1].device == torch.device("cuda", 1) and gpu.type(torch.float64).dtype == torch.float64
    read_off = internal["read"](gpu)[0]  # what torch's code places there is on the GPU it read it off
    assert device_view.host_index(read_off) == 1 and device_view.host_index(internal["read"](host)[0]) is None
    with devices.CudaToCpu():
        placed, moved = torch.zeros(1, device=read_off), torch.ones(1).to(read_off)
    assert [gpu_memory.gpu_index(t) for t in (placed, moved)] == [1, 1] and gpu.to(read_off) is gpu


def test_device_reads_make_no_torch_calls_a_program_mode_sees(monkeypatch):
    """`rank.device_view` reads which simulated GPU a tensor is on off its storage; that read
    is the rank layer's, not the program's: a `TorchFunctionMode` the program enters (a call
    logger, a profiler's) sees no `untyped_storage` call the program never made for its
    `x.device`/`is_cuda`/`is_cpu`/`get_device()`/`type()` reads. It saw one per read (and the
    dispatch doubled a read's cost under the rank layer's own mode); and `type()`, which torch
    hands to that mode, which answers it through the view again, says "torch.cuda.FloatTensor"
    (it said "torch.cuda.cuda.FloatTensor"). In-process, restored."""
    import torch
    from torch.overrides import TorchFunctionMode

    from simdist.script.rank import device_view, gpu_memory

    _keep(monkeypatch, torch.Tensor, inherited=("device", "is_cuda", "is_cpu", "get_device", "type"))
    device_view.install()

    class Log(TorchFunctionMode):
        def __init__(self) -> None:
            super().__init__()
            self.seen: list[str] = []

        def __torch_function__(self, func, types, args=(), kwargs=None):
            self.seen.append(getattr(func, "__name__", repr(func)))
            return func(*args, **(kwargs or {}))

    gpu, host = gpu_memory.mark(torch.zeros(2), 1), torch.zeros(2)
    with Log() as log:
        reads = [(t.device, t.is_cuda, t.is_cpu, t.get_device(), t.type()) for t in (gpu, host)]
    assert reads == [(torch.device("cuda", 1), True, False, 1, "torch.cuda.FloatTensor"),
                     (torch.device("cpu"), False, True, -1, "torch.FloatTensor")]
    assert "untyped_storage" not in log.seen, log.seen


def test_a_wrapper_subclass_on_a_gpu_reads_as_on_it(monkeypatch):
    """A tensor subclass that wraps others (DTensor, and so FSDP2's parameters: torch's
    `_make_wrapper_subclass` takes its device from its local tensor's, which is the CPU here)
    reads, to the program, as on the simulated GPU its first inner tensor is on, as it does on
    a GPU: `device = next(model.parameters()).device` after `fully_shard` said `cpu`, so the
    script's inputs were host tensors and its GPU branches skipped. torch's own code still
    reads the wrapper's CPU. (`TwoTensor`, torch's test wrapper subclass, stands for DTensor:
    no process group needed.) In-process, restored."""
    import torch
    from torch.testing._internal.two_tensor import TwoTensor

    from simdist.script.rank import device_view, gpu_memory

    _keep(monkeypatch, torch.Tensor, inherited=("device", "is_cuda", "is_cpu", "get_device", "type"))
    device_view.install()
    internal: dict = {"__name__": "torch.distributed.fake_internal"}
    exec("def read(t): return (t.device, t.is_cuda, t.get_device())", internal)
    wrapped = TwoTensor(gpu_memory.mark(torch.zeros(2), 1), gpu_memory.mark(torch.ones(2), 1))
    assert (wrapped.device, wrapped.is_cuda, wrapped.is_cpu, wrapped.get_device()) == (
        torch.device("cuda", 1), True, False, 1)
    assert internal["read"](wrapped) == (torch.device("cpu"), False, -1)
    host = TwoTensor(torch.zeros(2), torch.ones(2))
    assert (host.device, host.is_cuda, host.get_device()) == (torch.device("cpu"), False, -1)


def test_cuda_autocast_state_reads_as_on_a_gpu(monkeypatch):
    """Inside `torch.autocast("cuda", dtype=torch.bfloat16)` (which autocasts on the CPU here,
    `rank.devices`) a GPU says CUDA's autocast is on: `torch.is_autocast_enabled()` (no
    device: CUDA's, as torch documents), `is_autocast_enabled("cuda")` True,
    `get_autocast_dtype("cuda")` and `get_autocast_gpu_dtype()` bfloat16; outside, False and
    float16. They said False and float16 inside too (CUDA's state was never set), so code
    that asks (`torch.amp.custom_fwd(device_type="cuda")`, attention code picking its dtype)
    took its no-autocast path; a script's `torch.autocast(x.device.type)` reaches it since
    `x.device.type` is "cuda" (`rank.device_view`). In-process, restored."""
    import warnings

    import torch
    from torch.amp.autocast_mode import autocast

    from simdist.script.rank import amp

    for name in ("is_autocast_enabled", "get_autocast_dtype", "get_autocast_gpu_dtype"):
        monkeypatch.setattr(torch, name, getattr(torch, name))
    monkeypatch.setattr(autocast, "__init__", autocast.__init__)
    amp.install()
    warnings.simplefilter("ignore", DeprecationWarning)  # (get_autocast_gpu_dtype's, as torch's)

    def state() -> tuple:
        return (torch.is_autocast_enabled(), torch.is_autocast_enabled("cuda"), torch.get_autocast_dtype("cuda"),
                torch.get_autocast_gpu_dtype())

    assert state() == (False, False, torch.float16, torch.float16)
    with torch.autocast("cuda", dtype=torch.bfloat16):
        inside = state()
        with torch.autocast("cuda", enabled=False):
            assert not torch.is_autocast_enabled("cuda")
        assert (torch.ones(2, 2) @ torch.ones(2, 2)).dtype == torch.bfloat16
    assert inside == (True, True, torch.bfloat16, torch.bfloat16)
    assert state() == (False, False, torch.float16, torch.float16)
