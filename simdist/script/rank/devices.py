"""CUDA on a machine without one: every CUDA device the script names is the CPU.

Scripts written for GPUs (`cuda:{rank}`, `.to(rank)`, `.cuda()`, `torch.cuda.set_device`,
`DDP(..., device_ids=[rank])`) run unmodified on CPU tensors:

* a global `TorchFunctionMode` rewrites the `device=` argument of torch calls (factories)
  from CUDA to the CPU. A mode sees a call before torch parses its arguments, so it also
  catches an int device, which torch resolves through the accelerator. `torch.device("cuda:1")`
  objects stay what they are: only where a tensor is placed changes;
* `Tensor.to`, `Tensor.cuda` and `Tensor.pin_memory` are replaced on the class itself: torch
  pops a mode while its `__torch_function__` runs, so code that runs *inside* a call the mode
  saw (autograd's backward, and in it DTensor's `from_local(...).to(mesh.device_type)`, a
  `cuda` mesh's tensors) would not be remapped by the mode;
* `Module.to` parses its device before any tensor call, so it is remapped directly;
* `torch.autocast("cuda")` (and `torch.cuda.amp.autocast`) autocasts on the CPU, to the dtype
  CUDA's would (float16 unless given): CUDA's would find no device ("Torch not compiled with
  CUDA enabled" once it asks whether the GPU does bfloat16);
* storages move through `torch.storage._to`, which `torch.load` calls for every storage whose
  location (saved, or `map_location=`) is a CUDA device (`map_location=f"cuda:{rank}"`, a
  checkpoint written on a GPU), and `UntypedStorage.cuda()` too: remapped there;
* `torch.cuda` reports `SIMDIST_SCRIPT_GPUS` simulated devices (`is_available`,
  `device_count`, `set_device`, `current_device`, `synchronize`, streams and events that
  have nothing to wait for, ...);
* DDP is given no `device_ids`/`output_device` for a module on the CPU (which it rejects).

The mode is entered on the main thread, where scripts (and CPU autograd) run, and on every
thread the script starts (`threading.Thread`, so also a `ThreadPoolExecutor`'s workers and
DataLoader's pin-memory thread): torch keeps a mode stack per thread, and a prefetching
thread that builds its batches with `device="cuda"` would otherwise fail with "Torch not
compiled with CUDA enabled" where the program runs on a GPU machine (and, with
`torch.cuda.is_available()` False, on a CPU one).
"""

from __future__ import annotations

import functools
import inspect
import threading
import types
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

_CPU = torch.device("cpu")


def is_accelerator(device: Any) -> bool:
    """Whether a device argument means a CUDA device (an int is an accelerator index)."""
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):
        return device.type == "cuda"
    return False


def _remap_args(args: tuple) -> tuple:
    return tuple(_CPU if is_accelerator(a) else a for a in args)


class CudaToCpu(TorchFunctionMode):
    """Rewrites CUDA device arguments of torch calls to the CPU."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs:
            dev = kwargs.get("device")
            if dev is not None and is_accelerator(dev):
                kwargs = {**kwargs, "device": _CPU}
        else:
            kwargs = {}
        return func(*args, **kwargs)


def _patch_tensor_moves() -> None:
    """`Tensor.to(cuda)` / `.cuda()` place the tensor on the CPU, `.pin_memory()` is the
    tensor itself, wherever they are called from (see the module's docstring)."""
    orig_to = torch.Tensor.to

    @functools.wraps(orig_to)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs and is_accelerator(kwargs["device"]):
            kwargs["device"] = _CPU
        return orig_to(self, *_remap_args(args), **kwargs)

    @functools.wraps(torch.Tensor.cuda)
    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
             memory_format: torch.memory_format = torch.preserve_format) -> Any:
        return orig_to(self, _CPU, non_blocking=non_blocking, memory_format=memory_format)

    @functools.wraps(torch.Tensor.pin_memory)
    def pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self

    torch.Tensor.to = to  # type: ignore[method-assign]
    torch.Tensor.cuda = cuda  # type: ignore[method-assign]
    torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign]


def _patch_storage_moves() -> None:
    """Storages placed on a CUDA device are placed on the CPU (see the module's docstring)."""
    import torch.storage as ts

    orig = ts._to

    @functools.wraps(orig)
    def _to(self: Any, device: torch.device, non_blocking: bool = False) -> Any:
        return orig(self, _CPU if is_accelerator(device) else device, non_blocking)

    ts._to = _to


def _patch_autocast() -> None:
    """`autocast` for CUDA autocasts on the CPU (see the module's docstring)."""
    from torch.amp.autocast_mode import autocast

    orig = autocast.__init__

    @functools.wraps(orig)
    def __init__(self: Any, device_type: str, dtype: torch.dtype | None = None, *args: Any, **kwargs: Any) -> None:
        if isinstance(device_type, str) and device_type.startswith("cuda"):
            device_type, dtype = "cpu", dtype if dtype is not None else torch.get_autocast_dtype("cuda")
        orig(self, device_type, dtype, *args, **kwargs)

    autocast.__init__ = __init__  # type: ignore[method-assign]


def _enter_in_new_threads() -> None:
    """Every thread started through `threading` runs its target inside its own `CudaToCpu`."""
    orig = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    @functools.wraps(orig)
    def _bootstrap_inner(self: threading.Thread) -> None:
        with CudaToCpu():
            orig(self)

    threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]


class _Gpus:
    """What the `torch.cuda` shims report."""

    count = 8
    current = 0


def _index(device: Any) -> int:
    if isinstance(device, torch.device):
        return device.index or 0
    if isinstance(device, str):
        return torch.device(device).index or 0
    return int(device)


class _DeviceContext:
    """`torch.cuda.device(n)`: selects nothing on the CPU."""

    def __init__(self, device: Any):
        self.device = device

    def __enter__(self) -> None:
        return None

    def __exit__(self, *exc: Any) -> None:
        return None


class _Stream:
    """A CUDA stream or event on the CPU: work is done when it is issued, so there is nothing
    to wait for (torch.distributed.checkpoint's writer overlaps copies on the current stream
    once CUDA is available; scripts make side streams and events for overlap and timing)."""

    device_type = "cuda"

    def __init__(self, *args: Any, **kwargs: Any):
        self.device = torch.device("cuda", _Gpus.current)

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def record(self, stream: Any = None) -> None:
        return None

    def record_event(self, event: Any = None) -> Any:
        return event if event is not None else _Stream()

    def elapsed_time(self, end: Any) -> float:
        return 0.0


_CURRENT_STREAM = _Stream()
# `torch.cuda.get_device_properties` (and `get_device_capability`, which reads it): a compute
# capability 8.0 device, one that has bfloat16, with no memory to report
_PROPERTIES = types.SimpleNamespace(name="simdist simulated GPU (CPU)", major=8, minor=0, total_memory=0,
                                    multi_processor_count=1, is_integrated=False)


def _install_cuda_shims(gpus: int) -> None:
    import torch.cuda as tc

    _Gpus.count = gpus
    shims: dict[str, Any] = {
        "is_available": lambda: True,
        "device_count": lambda: _Gpus.count,
        "set_device": lambda device: setattr(_Gpus, "current", _index(device)),
        "current_device": lambda: _Gpus.current,
        "synchronize": lambda device=None: None,
        "empty_cache": lambda: None,
        "get_device_name": lambda device=None: "simdist simulated GPU (CPU)",
        # what a script asks before choosing bfloat16 (nanoGPT's default dtype): the CPU does it
        "is_bf16_supported": lambda including_emulation=True: True,
        "get_device_properties": lambda device=None: _PROPERTIES,
        "memory_allocated": lambda device=None: 0,
        "max_memory_allocated": lambda device=None: 0,
        "reset_peak_memory_stats": lambda device=None: None,
        "device": _DeviceContext,
        "Stream": _Stream,
        "Event": _Stream,
        "current_stream": lambda device=None: _CURRENT_STREAM,
        "default_stream": lambda device=None: _CURRENT_STREAM,
        "stream": _DeviceContext,
    }
    for name, fn in shims.items():
        setattr(tc, name, fn)
    # Under NCCL semantics `get_backend` says "nccl", and torch's c10d logger (every
    # torch.distributed.checkpoint call, any c10d call that raises) then asks the NCCL version,
    # which a CPU build lacks: dcp.save failed in the simulator alone. A fixed version stands in
    # (the NCCL of the CUDA 13 wheels: 2.30.7); nothing is modelled on it.
    tc.nccl.version = lambda: (2, 30, 7)


def _patch_module_to() -> None:
    orig = torch.nn.Module.to

    @functools.wraps(orig)
    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        if "device" in kwargs and is_accelerator(kwargs["device"]):
            kwargs["device"] = _CPU
        return orig(self, *_remap_args(args), **kwargs)

    torch.nn.Module.to = to  # type: ignore[method-assign]


def _patch_ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig = DDP.__init__
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = sig.bind(self, *args, **kwargs)
        module = bound.arguments.get("module")
        on_cpu = module is not None and all(p.device.type == "cpu" for p in module.parameters())
        if on_cpu:
            for name in ("device_ids", "output_device"):
                if name in bound.arguments:
                    bound.arguments[name] = None
        orig(*bound.args, **bound.kwargs)

    DDP.__init__ = __init__  # type: ignore[method-assign]


def place_fsdp_on_cpu(fsdp_module: Any) -> None:
    """FSDP (`FullyShardedDataParallel`) of a GPU script's module, given no `device_id` or a
    CUDA one, runs on the CPU the simulated GPUs stand for: the module is on the CPU (its
    `.to(rank)` remapped), and FSDP, finding no parameter off the CPU, asked torch for a
    non-CPU accelerator and raised "FSDP needs a non-CPU accelerator device" on both sides
    (the DCP recipe, the FSDP tutorial unedited). Given `torch.distributed.fsdp.
    fully_sharded_data_parallel` once the script imports it (importing FSDP costs ~1 s)."""
    cls = fsdp_module.FullyShardedDataParallel
    orig = cls.__init__
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = sig.bind(self, *args, **kwargs)
        device_id = bound.arguments.get("device_id")
        if device_id is None or is_accelerator(device_id):
            bound.arguments["device_id"] = _CPU
        orig(*bound.args, **bound.kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]


_MODE: CudaToCpu | None = None


def install(gpus: int) -> None:
    """Remap CUDA to the CPU for the rest of this process (every thread)."""
    global _MODE
    if _MODE is not None:
        return
    _install_cuda_shims(gpus)
    _patch_tensor_moves()
    _patch_module_to()
    _patch_storage_moves()
    _patch_autocast()
    _patch_ddp()
    _enter_in_new_threads()
    _MODE = CudaToCpu()
    _MODE.__enter__()
