"""On simulated GPUs, what a CUDA build of torch says where this host's CPU build says no CUDA.

* `torch.version.cuda` is `CUDA_VERSION` to the program (any module but torch's and simdist's,
  the device view's caller rule: `rank.device_view`), where the CPU build says None; torch's
  own code still reads None, since it picks CPU kernels and compiled code's layouts by it
  (`_meta_registrations`' grouped-mm strides, inductor's cache keys and libdevice).
* DDP's `register_comm_hook` accepts the bf16 compression hooks (`bf16_compress_hook`,
  `bf16_compress_wrapper`) as a CUDA build with NCCL >= 2.10 does: torch's `_check_comm_hook`
  refused them with "BF16 all reduce communication hook required CUDA 11+ and NCCL 2.10+"
  (it asks `torch.version.cuda` and `dist.is_nccl_available()`, and not the model's device,
  so on a GPU node it passes for a CPU model and Gloo too). The hook itself then runs as torch
  wrote it (a bf16 all-reduce of the bucket).
"""

from __future__ import annotations

import functools
import types
from typing import Any

from simdist.script.rank import device_view

# CUDA 13.0: the CUDA of the wheels whose NCCL `gpu_shims` reports (2.30.7); it supports the
# A100 (compute capability 8.0) that `gpu_props` describes.
CUDA_VERSION = "13.0"
_BF16_HOOKS = ("bf16_compress_hook", "bf16_compress_wrapper_hook")


class _Version(types.ModuleType):
    @property
    def cuda(self) -> str | None:
        return CUDA_VERSION if device_view._asked_by_program(2) else None


def _patch_check_comm_hook() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    orig = DDP._check_comm_hook

    @functools.wraps(orig)
    def _check_comm_hook(self: Any, hook: Any) -> None:
        if getattr(hook, "__name__", None) in _BF16_HOOKS:
            checked = functools.wraps(hook)(lambda *a, **k: hook(*a, **k))  # its signature, checked as torch does
            checked.__name__ = "bf16_on_a_cuda_build"  # the CUDA and NCCL check passes there
            hook = checked
        return orig(self, hook)

    DDP._check_comm_hook = _check_comm_hook  # type: ignore[method-assign]


def install() -> None:
    import torch.version

    torch.version.__class__ = _Version
    _patch_check_comm_hook()
