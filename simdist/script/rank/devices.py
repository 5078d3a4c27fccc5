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
  `cuda` mesh's tensors) would not be remapped by the mode; a move copies where a GPU's
  would (whenever the simulated device changes: `simdist.script.rank.gpu_memory` says which
  memory is a simulated GPU's, for every view and result of it), and `.cpu()` and `.numpy()`
  are replaced for that;
* `Module.to`/`.cuda()` parse their device before any tensor call, so they name `cuda:N`
  to torch and move each tensor through the patched `Tensor.to`;
* `torch.autocast("cuda")` autocasts on the CPU (`simdist.script.rank.amp`);
* storages move through `torch.storage._to`, which `torch.load` calls for every storage whose
  location (saved, or `map_location=`) is a CUDA device (`map_location=f"cuda:{rank}"`, a
  checkpoint written on a GPU), and `UntypedStorage.cuda()`/`.cpu()` too: remapped there, a
  copy whenever the simulated device changes (torch returns the storage itself only when it
  is already there), as for tensors;
* `torch.cuda` and `torch.accelerator` report `SIMDIST_SCRIPT_GPUS` simulated devices
  (`simdist.script.rank.gpu_shims`);
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
import threading
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from simdist.script.rank import (
    amp,
    compiled_moves,
    cuda_build,
    cuda_init,
    device_view,
    gpu_grads,
    gpu_memory,
    gpu_shims,
    legacy_types,
    wrapper_devices,
)
from simdist.script.rank.device_args import (
    CPU as _CPU,
)
from simdist.script.rank.device_args import (
    compiling,
    graph_destination,
    is_accelerator,
    is_cpu,
    move_target,
    remap_args,
    stands_for_gpu,
    target_index,
)

_PLAIN = gpu_memory.PLAIN


# Factories that return their input's memory when it is already where they place it: on a
# GPU `torch.as_tensor(host_array_or_tensor, device="cuda")` is a copy on the device; placed on
# the CPU it is the host data itself (a host tensor: the tensor itself, then marked as standing
# for a GPU one), so a batch normalised in place after it changed the host array or tensor here
# only. A copy is made unless the input stands for a tensor on that GPU (then a GPU returns it too).
# Placed on the host, a GPU tensor's result is a host copy likewise (the memory changes device).
_MAY_ALIAS = (torch.as_tensor, torch.asarray)
_FRESH = (list, tuple, int, float, complex, bool)  # inputs of which any result is a new tensor anyway


class CudaToCpu(TorchFunctionMode):
    """Rewrites CUDA device arguments of torch calls to the CPU and places what they make on
    the simulated GPU; the tensor results of a call on a simulated GPU's tensors are on it
    too (`gpu_memory`: the device is the storage's, as a GPU kernel's outputs are on its
    inputs' device)."""

    def __torch_function__(self, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        if kwargs:
            dev = kwargs.get("device")
            if dev is not None:
                if not is_accelerator(dev):  # placed on the host explicitly: not propagated (a GPU
                    out = func(*args, **kwargs)  # tensor's memory placed there: a host copy, `_MAY_ALIAS`)
                    if compiling():  # traced: "cpu" written out is a host move (`graph_destination`)
                        host = isinstance(out, torch.Tensor) and func not in _MOVES and graph_destination(dev) is not None
                        return compiled_moves.PLACE(out, compiled_moves.HOST) if host else out
                    return out.clone() if func in _MAY_ALIAS and stands_for_gpu(out) else out
                cuda_init.lazy_init()  # (torch: `maybe_initialize_device` before it places anything)
                out = func(*args, **{**kwargs, "device": _CPU})
                index = target_index(dev)
                if torch.compiler.is_compiling():  # traced by dynamo: a graph's move (`compiled_moves`)
                    return compiled_moves.PLACE(out, index) if isinstance(out, torch.Tensor) else out
                if func in _MAY_ALIAS and args and not isinstance(args[0], _FRESH) and \
                        gpu_memory.gpu_index(args[0]) != index:
                    out = out.clone()  # (`_MAY_ALIAS`)
                gpu_memory.mark_outputs(out, index)
                return out
            out = func(*args, **kwargs)
        else:
            out = func(*args)
        if not args:
            return out
        kind = type(out)  # a new tensor or several (an in-place op returns its input: nothing new)
        if (kind in _PLAIN and out is not args[0]) or kind is list or (kind is not torch.Size
                                                                         and isinstance(out, tuple)):
            # (compiling first: traced by dynamo, the membership of a traced move read wrong)
            if not compiling() and func not in _MOVES:
                index = gpu_memory.input_index(args)
                if index is not None:
                    gpu_memory.mark_outputs(out, index)
        return out


# The calls that decide their result's device themselves (the patched moves below), or
# whose result is host data: the mode does not propagate a device to their results.
_MOVES: set[Any] = set()


def _destination(self: torch.Tensor, target: Any) -> tuple[bool, int | None]:
    """(whether torch places the result by `target` here, the simulated GPU it is on: None for
    host memory) of `self.to(target)`; a device this layer does not model (meta) is not placed."""
    if target is None:
        return True, gpu_memory.gpu_index(self)
    if isinstance(target, torch.Tensor):
        return True, gpu_memory.gpu_index(target)
    if is_accelerator(target):
        return True, target_index(target)
    return is_cpu(target), None


def _patch_tensor_moves() -> None:
    """`Tensor.to(cuda)` / `.cuda()` place the tensor on the CPU, a copy where a GPU would
    copy: whenever the simulated device changes (host to GPU, GPU to host, GPU to another
    GPU: `gpu_memory`), never when it does not; `.cpu()` of a GPU tensor copies it;
    `.numpy()` of one raises as on a GPU; `.pin_memory()` is the tensor itself; wherever
    they are called from (module docstring)."""
    orig_to, orig_cpu, orig_numpy = torch.Tensor.to, torch.Tensor.cpu, torch.Tensor.numpy

    def plain_to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        # the CudaToCpu mode hands a method back to `torch.Tensor.to`, this wrapper, which
        # would take the remapped CPU device for a move to the host and copy a GPU tensor
        with torch._C.DisableTorchFunction():
            return orig_to(self, *args, **kwargs)

    @functools.wraps(orig_to)
    def to(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        target = move_target(args, kwargs)
        if is_accelerator(target) or (not compiling() and stands_for_gpu(target)):  # (traced: no storage
            cuda_init.lazy_init()  # read, a graph break) torch's `to` initialises CUDA for a CUDA device
        if is_accelerator(target) and "device" in kwargs:
            kwargs["device"] = _CPU
        if type(self) not in _PLAIN:  # (also every tensor AOT autograd and inductor trace: fake ones)
            return orig_to(self, *remap_args(args), **kwargs)
        if torch.compiler.is_compiling():  # traced by dynamo: a graph's move (`compiled_moves`)
            dest = graph_destination(target)
            out = orig_to(self, *remap_args(args), **kwargs)
            return out if dest is None else compiled_moves.PLACE(out, dest)
        placed, dest = _destination(self, target)
        if not placed:
            return plain_to(self, *args, **kwargs)
        if dest != gpu_memory.gpu_index(self):  # the device changes: a GPU copies, whatever `copy=False` says
            copy_at = 2 if isinstance(target, torch.Tensor) else 3  # where a positional `copy` is
            if len(args) > copy_at:
                args = (*args[:copy_at], True, *args[copy_at + 1:])
            else:
                kwargs["copy"] = True
        out = plain_to(self, *remap_args(args), **kwargs)
        return out if dest is None else gpu_memory.mark(out, dest)

    @functools.wraps(torch.Tensor.cuda)
    def cuda(self: torch.Tensor, device: Any = None, non_blocking: bool = False,
             memory_format: torch.memory_format = torch.preserve_format) -> Any:
        cuda_init.lazy_init()  # (torch's `Tensor.cuda` initialises CUDA first)
        dest = target_index("cuda" if device is None else device)
        if type(self) not in _PLAIN or torch.compiler.is_compiling():
            out = orig_to(self, _CPU, non_blocking=non_blocking, memory_format=memory_format)
            return out if type(self) not in _PLAIN else compiled_moves.PLACE(out, dest)
        copy = gpu_memory.gpu_index(self) != dest
        return gpu_memory.mark(plain_to(self, _CPU, non_blocking=non_blocking, memory_format=memory_format,
                                        copy=copy), dest)

    @functools.wraps(orig_cpu)
    def cpu(self: torch.Tensor, memory_format: torch.memory_format = torch.preserve_format) -> Any:
        if type(self) in _PLAIN and torch.compiler.is_compiling():
            return compiled_moves.PLACE(orig_cpu(self, memory_format=memory_format), compiled_moves.HOST)
        if type(self) in _PLAIN and stands_for_gpu(self):
            return plain_to(self, _CPU, memory_format=memory_format, copy=True)
        return orig_cpu(self, memory_format=memory_format)

    @functools.wraps(orig_numpy)
    def numpy(self: torch.Tensor, *, force: bool = False) -> Any:
        error = gpu_memory.numpy_refused(self, force)
        if error is not None:
            raise error
        if force and stands_for_gpu(self):  # torch: `self.detach().cpu()...numpy()`, a host copy
            return orig_numpy(cpu(self.detach()), force=True)
        return orig_numpy(self, force=force)

    @functools.wraps(torch.Tensor.pin_memory)
    def pin_memory(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        return self

    compiled_moves.install()  # (the op a traced move is)
    _MOVES.update({compiled_moves.PLACE, compiled_moves.PLACE.overloadpacket, orig_to, orig_cpu, orig_numpy, to, cuda, cpu, numpy, pin_memory, torch.Tensor.cuda,
                   torch.Tensor.type, torch.Tensor.pin_memory})
    torch.Tensor.to = to  # type: ignore[method-assign]
    torch.Tensor.cuda = cuda  # type: ignore[method-assign]
    torch.Tensor.cpu = cpu  # type: ignore[method-assign]
    torch.Tensor.numpy = numpy  # type: ignore[method-assign]
    torch.Tensor.pin_memory = pin_memory  # type: ignore[method-assign]


def _patch_record_stream() -> None:
    """`t.record_stream(stream)` of a simulated GPU tensor does nothing, as there is nothing to
    keep: CUDA's caching allocator holds the memory until the work queued on `stream` is done,
    and a CPU's work is done when it is issued (the streams are `gpu_streams.Stream`). A GPU
    script's prefetcher calls it after copying a batch on a side stream; it raised (torch:
    "Could not run 'aten::record_stream' with arguments from the 'CPU' backend"). A host
    tensor's raises as torch's does."""
    orig = torch.Tensor.record_stream

    @functools.wraps(orig)
    def record_stream(self: torch.Tensor, stream: Any) -> None:
        if stands_for_gpu(self):
            return None
        return orig(self, stream)

    torch.Tensor.record_stream = record_stream  # type: ignore[method-assign]


def _patch_storage_moves() -> None:
    """Storages placed on a CUDA device are placed on the CPU, on the simulated GPU (see the
    module's docstring)."""
    import torch.storage as ts

    orig = ts._to

    @functools.wraps(orig)
    def _to(self: Any, device: torch.device, non_blocking: bool = False) -> Any:
        here = gpu_memory.storage_index(self)
        if is_accelerator(device):
            cuda_init.lazy_init()
            index = target_index(device)
            return self if here == index else gpu_memory.mark_storage(gpu_memory.storage_copy(self), index)
        if here is not None and is_cpu(device):
            return gpu_memory.storage_copy(self)
        return orig(self, device, non_blocking)

    orig_cpu = ts._StorageBase.cpu

    @functools.wraps(orig_cpu)
    def cpu(self: Any) -> Any:
        return orig_cpu(self) if gpu_memory.storage_index(self) is None else gpu_memory.storage_copy(self)

    ts._to = _to
    ts._StorageBase.cpu = cpu  # type: ignore[method-assign]


def _enter_in_new_threads() -> None:
    """Every thread started through `threading` runs its target inside its own `CudaToCpu`."""
    orig = threading.Thread._bootstrap_inner  # type: ignore[attr-defined]

    @functools.wraps(orig)
    def _bootstrap_inner(self: threading.Thread) -> None:
        with CudaToCpu():
            orig(self)

    threading.Thread._bootstrap_inner = _bootstrap_inner  # type: ignore[attr-defined]


def _patch_module_to() -> None:
    """`Module.to(cuda)`/`.cuda()` move the module's tensors with the patched `Tensor.to`, as a
    GPU's move does: a host parameter gets new memory on the simulated GPU (the same
    `Parameter` object, its `.data` replaced), one already there stays as it is; `.cpu()`
    copies them back. The device is given to torch as `cuda:N`: `Module.to` parses its
    arguments first, and an int device there would be the CPU's (no accelerator)."""
    orig_to, orig_cuda = torch.nn.Module.to, torch.nn.Module.cuda

    @functools.wraps(orig_to)
    def to(self: torch.nn.Module, *args: Any, **kwargs: Any) -> Any:
        target = move_target(args, kwargs)
        if is_accelerator(target):
            device = torch.device("cuda", target_index(target))
            if "device" in kwargs:
                kwargs = {**kwargs, "device": device}
            else:
                args = (device, *args[1:])
        return orig_to(self, *args, **kwargs)

    @functools.wraps(orig_cuda)
    def cuda(self: torch.nn.Module, device: Any = None) -> Any:
        return to(self, "cuda" if device is None else device)

    torch.nn.Module.to = to  # type: ignore[method-assign]
    torch.nn.Module.cuda = cuda  # type: ignore[method-assign]


def _patch_generator() -> None:
    """`torch.Generator(device="cuda")` (a GPU script's sampler or dropout generator) makes a
    CPU generator: CUDA's failed with "Cannot get CUDA generator without ATen_cuda library".
    `torch.Generator` stays a type every generator is an instance of (torch checks
    `isinstance(g, torch.Generator)`); what it makes is torch's own generator."""
    base = torch._C.Generator

    class _Meta(type(base)):  # type: ignore[misc]
        def __instancecheck__(cls, obj: Any) -> bool:
            return isinstance(obj, base)

        def __subclasscheck__(cls, sub: Any) -> bool:
            return issubclass(sub, base)

    class Generator(base, metaclass=_Meta):  # type: ignore[misc,valid-type]
        __doc__ = base.__doc__

        def __new__(cls, device: Any = "cpu") -> Any:
            return base(_CPU if is_accelerator(device) else device)

    torch.Generator = Generator  # type: ignore[misc]


def _patch_device_context() -> None:
    """A CUDA default device (`with torch.device("cuda"):`, `torch.set_default_device`) places
    factories on the simulated GPU: torch's DeviceContext sits at the bottom of the mode stack,
    below `CudaToCpu`, and gave them `device="cuda"` after the remap had passed ("Torch not
    compiled with CUDA enabled")."""
    import torch.utils._device as ud

    orig = ud.DeviceContext.__torch_function__

    @functools.wraps(orig)
    def __torch_function__(self: Any, func: Any, types: Any, args: tuple = (), kwargs: dict | None = None) -> Any:
        kwargs = kwargs or {}
        if is_accelerator(self.device) and kwargs.get("device") is None and func in ud._device_constructors():
            cuda_init.lazy_init()
            out = func(*args, **{**kwargs, "device": _CPU})
            gpu_memory.mark_outputs(out, target_index(self.device))
            return out
        return orig(self, func, types, args, kwargs)

    ud.DeviceContext.__torch_function__ = __torch_function__  # type: ignore[method-assign]


_MODE: CudaToCpu | None = None


def install(gpus: int) -> None:
    """Remap CUDA to the CPU for the rest of this process (every thread)."""
    global _MODE
    if _MODE is not None:
        return
    gpu_shims.install(gpus)
    cuda_build.install()
    gpu_memory.install()
    gpu_grads.install()
    legacy_types.install()  # (before the device view, whose `type` must be the outer: it reads its caller)
    device_view.install()
    _patch_tensor_moves()
    _patch_record_stream()
    _patch_module_to()
    _patch_storage_moves()
    amp.install()
    wrapper_devices.install()
    _patch_device_context()
    _patch_generator()
    _enter_in_new_threads()
    _MODE = CudaToCpu()
    _MODE.__enter__()
