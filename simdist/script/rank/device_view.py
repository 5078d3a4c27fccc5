"""What a tensor on a simulated GPU says about its device: to the script's own code, what it
says on a GPU (`cuda:N`); to torch's own code, the CPU its memory is on.

Why two answers: a simulated GPU tensor is a CPU tensor whose storage is marked
(`simdist.script.rank.gpu_memory`). torch's own Python reads `t.device` to pick its CPU or
CUDA path (`Tensor.__reduce_ex__`, optimizers' foreach/fused choice, DDP's device checks,
FSDP, DTensor), and must keep seeing the CPU the data is on, where the CPU kernels run. The
script, and the libraries it imports, read it to decide where to put new tensors
(`torch.zeros(n, device=x.device)`, `y.to(x.device)`, `device =
next(model.parameters()).device`) and which branch to take (`x.device.type == "cuda"`,
`x.is_cuda`): there it said `cpu`, so such tensors were host tensors (not counted as GPU
memory, `y.to(x.device)` of a GPU tensor a host copy) and GPU branches were skipped.

Who asks is the caller's frame: code whose module is `torch` or `simdist` (or under them)
gets torch's own answer; any other module's gets the GPU's (`cuda:N`, `is_cuda` True,
`is_cpu` False, `get_device()` N, `type()` "torch.cuda.FloatTensor"); a wrapper subclass
(DTensor, FSDP2's parameters) answers the program by its first inner tensor. A device the script
passes back to torch is a CUDA device, which the rank layer remaps
(`simdist.script.rank.devices`). torch's own answer for a tensor on simulated GPU N is a
CPU device, but always the same object (`host_device(N)`), which the rank layer's placing
code recognises (`host_index`): what torch places on a device it read off a GPU tensor
(`clip_grad_norm_`'s `norm.to(grads[0].device)`, an optimizer's `load_state_dict` moving
its state to each parameter's device, `torch.empty(..., device=p.device)`) is on that GPU,
as on a GPU, while torch's kernels and checks see the CPU (`device.type == "cpu"`, equal
to every CPU device). Inside a compiled function (`torch.compile`) dynamo reads
devices off its fake tensors, which are the CPU's: `idx.device.type` there is "cpu" (no
graph break, `fullgraph=True` compiles).
"""

from __future__ import annotations

import functools
import sys
from typing import Any

import torch
from torch.utils._python_dispatch import is_traceable_wrapper_subclass

from simdist.script.rank import gpu_memory

VIEWS = ("device", "is_cuda", "is_cpu", "get_device", "type")  # what `install` sets on `torch.Tensor`
_INTERNAL = frozenset({"torch", "simdist"})  # top-level packages whose code sees the memory's own device
_CUDA: dict[int, torch.device] = {}
_HOST: dict[int, torch.device] = {}  # GPU index -> the CPU device object torch's code reads for it
_HOST_INDEX: dict[int, int] = {}  # id() of such an object -> its GPU index (the objects live forever)


def _asked_by_program(depth: int) -> bool:
    """Whether the code reading the attribute (`depth` frames up) is the program's: any module
    but torch's and simdist's."""
    name = sys._getframe(depth).f_globals.get("__name__") or ""
    return name.partition(".")[0] not in _INTERNAL


def _gpu_of(t: Any) -> int | None:
    """`gpu_memory.gpu_index(t)` with no torch call dispatched: the storage read is the rank
    layer's, so a `TorchFunctionMode` the program entered sees no `untyped_storage` it never
    called (and the rank layer's own mode does not double the read's cost)."""
    if type(t) not in gpu_memory.PLAIN:
        return None
    with torch._C.DisableTorchFunction():
        return gpu_memory.gpu_index(t)


def _wrapped_gpu(t: Any) -> int | None:
    """The simulated GPU a wrapper subclass (DTensor, so FSDP2's parameters) stands on: its
    first inner tensor's. torch makes the wrapper with its local tensor's device
    (`_make_wrapper_subclass`), the CPU here, where on a GPU it is the GPU's."""
    if not is_traceable_wrapper_subclass(t):
        return None
    names, _ = t.__tensor_flatten__()
    if not names:
        return None
    inner = getattr(t, names[0])
    return _gpu_of(inner) if type(inner) in gpu_memory.PLAIN else _wrapped_gpu(inner)


def program_index(t: Any) -> int | None:
    """The simulated GPU `t` (or the tensor a wrapper subclass wraps) is on, if the program
    (the caller's caller) asks; None for host memory or torch's own code."""
    if not _asked_by_program(3):
        return None
    return _gpu_of(t) if type(t) in gpu_memory.PLAIN else _wrapped_gpu(t)


def host_device(index: int) -> torch.device:
    """The CPU device torch's own code reads off a tensor on simulated GPU `index`: one object
    per GPU, so that a placement on it is recognised (module docstring)."""
    device = _HOST.get(index)
    if device is None:
        device = _HOST[index] = torch.device("cpu")
        _HOST_INDEX[id(device)] = index
    return device


def host_index(device: Any) -> int | None:
    """The simulated GPU whose tensor `device` was read off by torch's own code (None: any
    other device object)."""
    return _HOST_INDEX.get(id(device))


def _cuda(index: int) -> torch.device:
    device = _CUDA.get(index)
    if device is None:
        device = _CUDA[index] = torch.device("cuda", index)
    return device


def install() -> None:
    """`Tensor.device`, `.is_cuda`, `.is_cpu`, `.get_device()` and `.type()` answer by who asks (module
    docstring). Once per process (`devices.install`)."""
    base = torch._C.TensorBase
    base_device, base_is_cuda, base_is_cpu = base.device, base.is_cuda, base.is_cpu
    base_get_device, base_type = base.get_device, torch.Tensor.type

    def device(self: torch.Tensor) -> torch.device:
        index = _gpu_of(self)
        if index is not None:
            return _cuda(index) if _asked_by_program(2) else host_device(index)
        if type(self) not in gpu_memory.PLAIN and _asked_by_program(2):  # a wrapper: the program's read only
            index = _wrapped_gpu(self)
            if index is not None:
                return _cuda(index)
        return base_device.__get__(self)

    def is_cuda(self: torch.Tensor) -> bool:
        return program_index(self) is not None or base_is_cuda.__get__(self)

    def is_cpu(self: torch.Tensor) -> bool:
        return program_index(self) is None and base_is_cpu.__get__(self)

    @functools.wraps(base_get_device)
    def get_device(self: torch.Tensor) -> int:
        index = program_index(self)
        return base_get_device(self) if index is None else index

    @functools.wraps(base_type)
    def type_name(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and program_index(self) is not None:  # torch: "torch.cuda.FloatTensor"
            name = base_type(self)  # (a program's mode may have answered it through this view: already cuda)
            return name if name.startswith("torch.cuda.") else name.replace("torch.", "torch.cuda.", 1)
        return base_type(self, *args, **kwargs)

    torch.Tensor.device = property(device, doc=base_device.__doc__)  # type: ignore[assignment,method-assign]
    torch.Tensor.is_cuda = property(is_cuda, doc=base_is_cuda.__doc__)  # type: ignore[assignment,method-assign]
    torch.Tensor.is_cpu = property(is_cpu, doc=base_is_cpu.__doc__)  # type: ignore[assignment,method-assign]
    torch.Tensor.get_device = get_device  # type: ignore[method-assign]
    torch.Tensor.type = type_name  # type: ignore[method-assign]
