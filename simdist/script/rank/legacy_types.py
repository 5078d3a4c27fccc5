"""`Tensor.type(T)` with a legacy tensor type (`torch.cuda.FloatTensor`, "torch.cuda.HalfTensor",
`torch.FloatTensor`) on simulated GPUs.

Why: older GPU scripts convert with `x.type(torch.cuda.FloatTensor)` (or keep a `dtype =
torch.cuda.FloatTensor if use_cuda else torch.FloatTensor` switch); on a CPU build torch's
`type` raised "Cannot initialize CUDA without ATen_cuda library" for any CUDA type.

What torch does (`THPVariable_type`, torch/csrc/autograd/python_variable_methods.cpp): the
type names a dtype and a device type; the device stays the tensor's when its type matches,
else it is that type's device (CUDA: the current device); then `to` of that device and dtype,
which returns the tensor itself when neither changes and copies when the device does. Here
the same with the CPU type of that name (`torch.cuda.FloatTensor` -> `torch.FloatTensor`) and
the result placed on the simulated GPU (`gpu_memory`); a CPU type of a GPU tensor is a host copy.
"""

from __future__ import annotations

import functools
from typing import Any

import torch

from simdist.script.rank import cuda_init, gpu_memory


def _legacy(arg: Any) -> tuple[str, bool] | None:
    """(the CPU type's name, whether `arg` is a CUDA type) of a legacy tensor type given as
    a string or a `torch.tensortype`; None for anything else (a dtype, no argument)."""
    if isinstance(arg, str):
        name = arg
    elif isinstance(arg, type) and type(arg).__name__ == "tensortype":
        name = f"{arg.__module__}.{arg.__name__}"
    else:
        return None
    if name.startswith("torch.cuda.") and name.endswith("Tensor"):
        return "torch." + name[len("torch.cuda."):], True
    if name.startswith("torch.") and name.endswith("Tensor") and name.count(".") == 1:
        return name, False
    return None


def install() -> None:
    """`torch.Tensor.type` converts to legacy types as on a GPU (module docstring); once per
    process (`devices.install`), over the device view's `type` (`device_view`)."""
    orig = torch.Tensor.type

    @functools.wraps(orig)
    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        legacy = _legacy(args[0] if args else kwargs.get("dtype")) if type(self) in gpu_memory.PLAIN else None
        if legacy is None:
            return orig(self, *args, **kwargs)
        non_blocking = args[1] if len(args) > 1 else kwargs.get("non_blocking", False)
        name, cuda = legacy
        src = gpu_memory.gpu_index(self)
        if cuda:
            cuda_init.lazy_init()
            dest = src if src is not None else torch.cuda.current_device()
        else:
            dest = None
        with torch._C.DisableTorchFunction():
            out = torch._C.TensorBase.type(self, name, non_blocking)
            if dest != src and out.untyped_storage().data_ptr() == self.untyped_storage().data_ptr():
                out = out.clone()
        return out if dest is None else gpu_memory.mark(out, dest)

    torch.Tensor.type = type_  # type: ignore[method-assign]
