"""The GPUs a script sees on a machine without one: `torch.cuda` and `torch.accelerator`
report `SIMDIST_SCRIPT_GPUS` simulated devices (`simdist.script.rank.devices` places every
tensor of them on the CPU).

* `torch.cuda`: `is_available`, `device_count`, `set_device`, `current_device`,
  `synchronize`, streams and events that have nothing to wait for, ...;
* its generator state is the CPU generator's (`_install_cuda_rng_shims`);
* the device queries scripts make (`is_bf16_supported`, `get_device_capability`,
  `get_device_properties`, NVTX ranges) answer for one fixed device (`gpu_props.DeviceProperties`);
* the memory figures (`memory_allocated`, `memory_stats`, `empty_cache`, `mem_get_info`, ...)
  are each device's simulated caching allocator's (`_install_memory_stats`, `gpu_allocator`);
* `torch.accelerator`, the device-generic API of current scripts and tutorials
  (`current_accelerator()` -> cuda, `device_count`, `set_device_index`, `device_index`,
  `current_stream`, ...), reports the same devices: left alone it said "no accelerator"
  while `torch.cuda` said 8 GPUs, so such a script took its CPU path, or failed ("Cannot
  access accelerator device when none is available"); and `torch._C._get_accelerator`, which
  torch's own code asks (FSDP2's default mesh, `torch.get_device_module()`);
* CUDA's initialisation, and what it does across `fork`, is `simdist.script.rank.cuda_init`'s
  (every shim of a call that initialises CUDA calls its `lazy_init` first).
"""

from __future__ import annotations

import contextlib
import sys
from typing import Any

import torch

from simdist.script.rank import cuda_init, device_view, gpu_allocator, gpu_props, gpu_streams, visible_gpus
from simdist.script.rank.visible_gpus import Gpus as _Gpus


def _index(device: Any) -> int:
    if isinstance(device, torch.device):
        return device.index or 0
    if isinstance(device, str):
        return torch.device(device).index or 0
    return int(device)


def _asked_by_inductor(depth: int) -> bool:
    """Whether the caller (`depth` frames up) is inductor's code (`torch._inductor`)."""
    name = sys._getframe(depth).f_globals.get("__name__") or ""
    return name == "torch._inductor" or name.startswith("torch._inductor.")


def is_available() -> bool:
    """`torch.cuda.is_available()`: True, and the process poisons fork as torch's
    `_cuda_getDeviceCount` does, unless PYTORCH_NVML_BASED_CUDA_CHECK=1 (then torch counts
    devices through NVML: no CUDA call).

    Inductor (`torch.compile`'s default backend) is told False, as on a CPU-only torch: it
    compiles the graph dynamo traced on CPU fake tensors (`device_view`) to C++ kernels for
    the CPU, and where it asks whether CUDA is there it would otherwise make CUDA tensors of
    its own (its pattern matchers' example inputs, `fx_passes/fuse_attention.py`,
    `pad_mm.py`, `misc_patterns.py`: "PyTorch is not linked with support for cuda devices"
    on the first compile of a process with no cached graph) or pick GPU-only choices for a
    CPU graph."""
    import torch.cuda as tc

    if not tc._nvml_based_avail():
        cuda_init.poison_fork()
    return visible_gpus.count() > 0 and not _asked_by_inductor(2)


def _cuda_device_index(device: Any, optional: bool = False) -> int:
    """torch's own reading of a CUDA device argument (`torch.cuda._utils._get_device_index`):
    an int as it is, `cuda:N` -> N, and a device with no index (or None) the current device when
    `optional` (asked through `torch.cuda.current_device()`, which initialises CUDA), else
    torch's ValueError, as torch's own callers raise it."""
    from torch.cuda._utils import _get_device_index

    return _get_device_index(device, optional=optional)


def _select_index(index: int) -> None:
    """Device `index` becomes the current one: a negative index is a no-op (torch), any other
    initialises CUDA first (`_cuda_setDevice`, `_accelerator_setDeviceIndex`)."""
    if index >= 0:
        cuda_init.lazy_init()
        visible_gpus.check_ordinal(index)
        _Gpus.current = index


def _set_device(device: Any) -> None:
    """`torch.cuda.set_device`: torch reads the device with `_get_device_index(device)`, so
    `set_device("cuda")` raises torch's "Expected a torch.device with a specified index or an
    integer" (it selected device 0)."""
    _select_index(_cuda_device_index(device))


def _set_device_index(device: Any) -> None:
    """`torch.accelerator.set_device_index`: torch reads the device with its accelerator
    `_get_device_index(device, optional=False)`."""
    from torch.accelerator._utils import _get_device_index

    _select_index(_get_device_index(device, optional=False))


class _DeviceContext:
    """`torch.accelerator.device_index(n)`, `torch.cuda.stream(s)`: the current device is n
    inside (None: unchanged), as on a GPU; nothing else is selected on the CPU. Entering one
    with a device index n >= 0 (torch's `_exchange_device`) or a stream (`StreamContext` asks
    `current_stream`) initialises CUDA; None and a negative n are no-ops, as in torch."""

    def __init__(self, device: Any):
        self.device = device
        self._before = _Gpus.current

    def __enter__(self) -> None:
        self._before = _Gpus.current
        if self.device is None:
            pass
        elif isinstance(self.device, gpu_streams.Stream):
            cuda_init.lazy_init()
        elif _index(self.device) >= 0:
            cuda_init.lazy_init()
            visible_gpus.check_ordinal(_index(self.device))
            _Gpus.current = _index(self.device)

    def __exit__(self, *exc: Any) -> None:
        _Gpus.current = self._before


class _CudaDeviceContext(_DeviceContext):
    """`torch.cuda.device(d)`: torch reads `d` when it is made, with
    `_get_device_index(d, optional=True)`: None, "cuda" and `torch.device("cuda")` name the
    current device (asked through `current_device()`: CUDA is initialised); "cuda" selected
    device 0 before."""

    def __init__(self, device: Any):
        super().__init__(_cuda_device_index(device, optional=True))




_PROPS = gpu_props.DeviceProperties()


def _properties(device: Any = None) -> gpu_props.DeviceProperties:
    """`torch.cuda.get_device_properties(device)`: its device read as torch reads it, and an
    index outside the node refused with torch's words."""
    from torch.cuda._utils import _get_device_index

    read_off = device_view.host_index(device)  # (a device torch's code read off a GPU tensor: that GPU)
    index = _get_device_index(device, optional=True) if read_off is None else read_off
    if index < 0 or index >= visible_gpus.count():
        raise AssertionError("Invalid device id")
    return gpu_props.of(visible_gpus.physical(index))


def _install_queries(tc: Any) -> None:
    """The device queries scripts make to pick a dtype or a kernel, or to log, answered for
    `_PROPS` (each raised "Torch not compiled with CUDA enabled"); NVTX ranges mark nothing."""
    import types

    shims: dict[str, Any] = {
        # each asks the current device or the device's properties: CUDA initialised first
        "is_bf16_supported": cuda_init.initialising(lambda including_emulation=True: True),
        "get_device_capability": cuda_init.initialising(lambda device=None: (_PROPS.major, _PROPS.minor)),
        "get_device_properties": cuda_init.initialising(_properties),
        "ipc_collect": cuda_init.initialising(lambda: None),
    }
    for name, fn in shims.items():
        setattr(tc, name, fn)
    nvtx = types.SimpleNamespace(range_push=lambda msg: 0, range_pop=lambda: 0, mark=lambda msg: None,
                                 range_start=lambda msg: 0, range_end=lambda range_id: None,
                                 range=lambda msg, *args, **kwargs: contextlib.nullcontext())
    for name in vars(nvtx):
        setattr(tc.nvtx, name, getattr(nvtx, name))
    # Under NCCL semantics `get_backend` says "nccl", and torch's c10d logger (every
    # torch.distributed.checkpoint call, any c10d call that raises) then asks the NCCL version,
    # which a CPU build lacks: dcp.save failed in the simulator alone. A fixed version stands in
    # (the NCCL of the CUDA 13 wheels: 2.30.7); nothing is modelled on it.
    tc.nccl.version = lambda: (2, 30, 7)


def install(gpus: int) -> None:
    """`torch.cuda` and `torch.accelerator` report `gpus` devices, their streams and
    generator state work, CUDA's initialisation poisons fork (module docstring)."""
    import torch.cuda as tc

    visible_gpus.install(gpus)
    cuda_init.install()
    # the binding a CUDA build has (torch/csrc/cuda/Module.cpp) and scripts ask directly
    # (Accelerate's notebook test after `notebook_launcher` forks): AttributeError on a CPU build
    torch._C._cuda_isInBadFork = cuda_init.in_bad_fork
    shims: dict[str, Any] = {
        "is_available": is_available,
        "device_count": visible_gpus.count,
        "init": cuda_init.lazy_init,
        "_is_in_bad_fork": cuda_init.in_bad_fork,
        "set_device": _set_device,
        "current_device": cuda_init.initialising(lambda: _Gpus.current),
        "synchronize": cuda_init.initialising(lambda device=None: None),
        "get_device_name": cuda_init.initialising(lambda device=None: "simdist simulated GPU (CPU)"),
        "device": _CudaDeviceContext,
        "Stream": gpu_streams.Stream,
        "Event": gpu_streams.Event,
        "current_stream": cuda_init.initialising(lambda device=None: gpu_streams.CURRENT_STREAM),
        "default_stream": cuda_init.initialising(lambda device=None: gpu_streams.CURRENT_STREAM),
        "stream": _DeviceContext,
    }
    for name, fn in shims.items():
        setattr(tc, name, fn)
    _install_queries(tc)
    _install_memory_stats()
    _install_cuda_rng_shims()
    _install_accelerator_shims()


def _allocator(index: int) -> gpu_allocator.DeviceAllocator:
    """Device `index`'s allocator, as c10's `assertValidDevice` admits it: CUDA initialised
    (before that torch has no allocator for any device) and a device that exists."""
    if not (cuda_init._Init.initialized and 0 <= index < visible_gpus.count()):
        raise RuntimeError(f"Invalid device argument {index}: did you call init?")
    return gpu_allocator.device(index)


def _memory_stats_as_nested_dict(device: Any = None) -> dict[str, Any]:
    """torch's `memory_stats_as_nested_dict`: {} until CUDA is initialised (and in a bad
    fork), else the device's allocator statistics (`gpu_allocator`)."""
    if not cuda_init._Init.initialized:
        return {}
    return _allocator(_cuda_device_index(device, optional=True)).stats()


def _empty_cache() -> None:
    """torch's `empty_cache`: every device's cached free segments are given back (c10's
    `emptyCache` empties each device's allocator, `gpu_allocator.empty_all`), once CUDA is
    initialised."""
    if cuda_init._Init.initialized:
        gpu_allocator.empty_all(visible_gpus.count())


def _mem_get_info(device: Any = None) -> tuple[int, int]:
    """torch's `mem_get_info`: (free, total) of the device, free being what the device's
    segments leave (a GPU's CUDA context, ~0.5 GiB, and other processes are not modelled)."""
    cuda_init.lazy_init()
    index = _cuda_device_index(torch.cuda.current_device() if device is None else device, optional=True)
    return _PROPS.total_memory - _allocator(index).reserved(), _PROPS.total_memory


def _install_memory_stats() -> None:
    """`torch.cuda`'s memory statistics are the simulated GPUs' allocators' (`gpu_allocator`,
    fed by `gpu_memory` with every storage placed on a simulated GPU): torch's own Python
    functions (`memory_stats`, `memory_allocated`, `max_memory_allocated`, `memory_reserved`,
    `max_memory_reserved`, `reset_peak_memory_stats`, `reset_max_memory_allocated`, ...) run
    as they are, on the bindings they call (`torch._C._cuda_memoryStats`,
    `_cuda_resetPeakMemoryStats`, `_cuda_resetAccumulatedMemoryStats`, `_cuda_emptyCache`),
    except the three that ask torch's own CUDA state (`is_initialized`, `cudart`). Each said 0
    before, whatever the script had placed on its GPU."""
    import torch.cuda as tc
    import torch.cuda.memory as tcm

    bindings: dict[str, Any] = {
        "_cuda_memoryStats": lambda index: _allocator(index).stats(),
        "_cuda_resetPeakMemoryStats": lambda index: _allocator(index).reset_peak(),
        "_cuda_resetAccumulatedMemoryStats": lambda index: _allocator(index).reset_accumulated(),
        "_cuda_emptyCache": _empty_cache,
    }
    for name, fn in bindings.items():
        setattr(torch._C, name, fn)
    for name, fn in (("memory_stats_as_nested_dict", _memory_stats_as_nested_dict),
                     ("empty_cache", _empty_cache), ("mem_get_info", _mem_get_info)):
        setattr(tcm, name, fn)
        setattr(tc, name, fn)


def _install_cuda_rng_shims() -> None:
    """CUDA's generator state is the CPU generator's: a "cuda" tensor's random numbers are
    drawn from the CPU generator here (the factory is remapped), so saving and restoring one
    state replays them. torch.compile's frame conversion saves and restores the CUDA state
    whenever `torch.cuda.is_available()` (every compiled call failed before with "Torch not
    compiled with CUDA enabled"), and so do scripts that replay dropout."""
    import torch.cuda as tc
    import torch.cuda.random as tcr

    shims: dict[str, Any] = {
        "get_rng_state": cuda_init.initialising(lambda device="cuda": torch.get_rng_state()),
        "set_rng_state": lambda new_state, device="cuda": torch.set_rng_state(new_state),
        "get_rng_state_all": cuda_init.initialising(lambda: [torch.get_rng_state() for _ in range(visible_gpus.count())]),
        "set_rng_state_all": lambda new_states: [torch.set_rng_state(s) for s in new_states[:1]] and None,
        "initial_seed": cuda_init.initialising(torch.initial_seed),
    }
    for name, fn in shims.items():
        setattr(tc, name, fn)
        setattr(tcr, name, fn)
    # torch's seed calls run once CUDA is initialised (`cuda_init._mark_torch`), on these
    tc.default_generators = (torch.default_generator,) * visible_gpus.count()
    tcr.current_device, tcr.device_count = tc.current_device, tc.device_count  # (imported there by name)


def _install_accelerator_shims() -> None:
    """`torch.accelerator` reports the simulated GPUs `torch.cuda` does (module docstring).
    torch's own callers get the same answers (the DataLoader pins through a pin-memory
    thread, as on a GPU; its pinning is the tensor itself, `_patch_tensor_moves`). As
    torch's, `is_available` is `torch.cuda.is_available` (which poisons fork), and the calls
    whose C++ binding calls `maybe_initialize_device` initialise CUDA
    (torch/csrc/DeviceAccelerator.cpp); `synchronize` is a no-op before that."""
    import torch.accelerator as ta
    import torch.cuda as tc

    shims: dict[str, Any] = {
        "is_available": lambda: tc.is_available(),
        "current_accelerator": lambda check_available=False: torch.device("cuda"),
        "device_count": visible_gpus.count,
        "current_device_index": cuda_init.initialising(lambda: _Gpus.current),
        "current_device_idx": cuda_init.initialising(lambda: _Gpus.current),
        "set_device_index": _set_device_index,
        "set_device_idx": _set_device_index,
        "device_index": _DeviceContext,
        "synchronize": lambda device=None: None,
        "current_stream": cuda_init.initialising(lambda device=None: gpu_streams.CURRENT_STREAM),
        "set_stream": cuda_init.initialising(lambda stream: None),
        # the allocator's figures are torch.cuda's (`_install_memory_stats`)
        "empty_cache": lambda: tc.empty_cache(),
        "memory_stats": lambda device_index=None, /: tc.memory_stats(device_index),
        "memory_allocated": lambda device_index=None, /: tc.memory_allocated(device_index),
        "max_memory_allocated": lambda device_index=None, /: tc.max_memory_allocated(device_index),
        "memory_reserved": lambda device_index=None, /: tc.memory_reserved(device_index),
        "max_memory_reserved": lambda device_index=None, /: tc.max_memory_reserved(device_index),
        "reset_peak_memory_stats": lambda device_index=None, /: tc.reset_peak_memory_stats(device_index),
        "reset_accumulated_memory_stats":
            lambda device_index=None, /: tc.reset_accumulated_memory_stats(device_index),
    }
    for name, fn in shims.items():
        setattr(ta, name, fn)
    # torch's own device pick (`torch.get_device_module()`, FSDP2's default mesh
    # `_init_default_mesh`, `init_process_group()` with no backend, `barrier`) asks torch._C,
    # not torch.accelerator: FSDP2 without a mesh built a CPU mesh where a GPU run's is "cuda"
    torch._C._get_accelerator = lambda check_available=False: torch.device("cuda")


def _mixed_seed(state: torch.Tensor, offset: int) -> int:
    """A 63-bit seed from a CPU generator state and a Philox-like offset (a digest: the same
    state and offset give the same seed on every rank, different offsets different seeds)."""
    import hashlib

    digest = hashlib.blake2b(state.numpy().tobytes() + int(offset).to_bytes(16, "little", signed=True),
                             digest_size=8).digest()
    return int.from_bytes(digest, "little") >> 1


def place_dtensor_rng_on_cpu(random_module: Any) -> None:
    """DTensor's random ops on a "cuda" mesh (FSDP2's meta-device initialisation, `to_empty`
    then `reset_parameters()`; a default mesh is "cuda" since `torch._C._get_accelerator`
    says so) run in torch's offset-based region (`OffsetBasedRNGTracker._distribute_region`):
    each shard draws from CUDA's Philox stream at its own offset (its linear shard index times
    the shard's size) and every rank leaves at the same state (the whole tensor's size on).
    The simulated CUDA generator is the CPU's (MT19937, no offsets: "AssertionError" where
    torch wrote the offset into its state), so the region does the same with seeds: the shard
    draws from the CPU generator seeded by (state, start offset), and leaves it seeded by
    (state, end offset). Shards are distinct and replicas equal, as on a GPU; the values are
    the CPU generator's, as every simulated GPU draw is. Given
    `torch.distributed.tensor._random` once the script imports it."""
    tracker = random_module.OffsetBasedRNGTracker
    orig = tracker._distribute_region

    @contextlib.contextmanager
    def _distribute_region(self: Any, spec: Any, generator: Any = None) -> Any:
        if self._device.type != "cuda" or not self.distribute_region_enabled:
            with orig(self, spec, generator):
                yield
            return
        gen = generator if generator is not None else torch.default_generator
        state = gen.get_state()
        start, end = self._compute_rng_offsets(spec)
        gen.manual_seed(_mixed_seed(state, start))
        try:
            yield
        finally:
            gen.manual_seed(_mixed_seed(state, -1 - end))  # (negative: never a shard's start)

    tracker._distribute_region = _distribute_region


def place_dtensor_meta_on_cpu(op_schema_module: Any) -> None:
    """DTensor's sharding propagation on a "cuda" mesh runs the op on fake tensors made on the
    CPU: torch makes them on the mesh's device type (`_rebuild_tensor_from_dtensor_meta`),
    inside DTensor's dispatch, where the rank layer's mode is not active, and a fake CUDA
    tensor's random op failed with "PyTorch is not linked with support for cuda devices"
    (FSDP2's meta-device initialisation). Only its shape, strides and dtype are read back.
    Given `torch.distributed.tensor._op_schema` once the script imports it."""
    orig = op_schema_module._rebuild_tensor_from_dtensor_meta

    def _rebuild_tensor_from_dtensor_meta(arg: Any) -> object:
        if arg.mesh.device_type != "cuda" or arg.tensor_meta is None:
            return orig(arg)
        meta = arg.tensor_meta
        return torch.empty_strided(meta.shape, meta.stride, dtype=meta.dtype, device="cpu")

    op_schema_module._rebuild_tensor_from_dtensor_meta = _rebuild_tensor_from_dtensor_meta
