"""`torch.autocast("cuda")` on a machine without CUDA: it autocasts on the CPU.

Why a module of its own: autocast is one concern apart from where tensors are placed
(`simdist.script.rank.devices`). `torch.autocast("cuda")` (and `torch.cuda.amp.autocast`)
autocasts on the CPU, to the dtype CUDA's would (float16 unless given): CUDA's would find no
device ("Torch not compiled with CUDA enabled" once it asks whether the GPU does bfloat16); and
CUDA's autocast state (`torch.is_autocast_enabled()`, `get_autocast_dtype("cuda")`, ...) reads
as the CPU's, which that sets.
"""

from __future__ import annotations

import functools
from typing import Any

import torch


def install() -> None:
    """`autocast` for CUDA autocasts on the CPU (module docstring), and CUDA's autocast state
    reads as the CPU's."""
    from torch.amp.autocast_mode import autocast

    orig = autocast.__init__

    @functools.wraps(orig)
    def __init__(self: Any, device_type: str, dtype: torch.dtype | None = None, *args: Any, **kwargs: Any) -> None:
        if isinstance(device_type, str) and device_type.startswith("cuda"):
            device_type, dtype = "cpu", dtype if dtype is not None else torch.get_autocast_dtype("cuda")
        orig(self, device_type, dtype, *args, **kwargs)

    autocast.__init__ = __init__  # type: ignore[method-assign]
    _patch_autocast_state()


def _patch_autocast_state() -> None:
    """Whether CUDA's autocast is on, and its dtype, read as the CPU's, which `autocast("cuda")`
    sets here: inside one a GPU's `torch.is_autocast_enabled()` (no device: CUDA's),
    `is_autocast_enabled("cuda")`, `get_autocast_dtype("cuda")` and `get_autocast_gpu_dtype()`
    say it is on and to which dtype; CUDA's own state here is never set (False, float16), so
    `torch.amp.custom_fwd(device_type="cuda")` and code picking its dtype by them took their
    no-autocast path. The dtype outside is CUDA's default (float16). A GPU script's own
    `torch.autocast("cpu")` reads as CUDA's too (one state for both here)."""
    orig_enabled, orig_dtype, orig_gpu_dtype = torch.is_autocast_enabled, torch.get_autocast_dtype, \
        torch.get_autocast_gpu_dtype

    def names_cuda(device_type: Any) -> bool:
        return device_type is None or (isinstance(device_type, str) and device_type.startswith("cuda"))

    @functools.wraps(orig_enabled)
    def is_autocast_enabled(*args: Any, **kwargs: Any) -> bool:
        device_type = args[0] if args else kwargs.get("device_type")
        return orig_enabled("cpu") if names_cuda(device_type) else orig_enabled(*args, **kwargs)

    @functools.wraps(orig_dtype)
    def get_autocast_dtype(device_type: Any) -> torch.dtype:
        if names_cuda(device_type) and orig_enabled("cpu"):
            return orig_dtype("cpu")
        return orig_dtype(device_type)

    @functools.wraps(orig_gpu_dtype)
    def get_autocast_gpu_dtype() -> torch.dtype:
        dtype = orig_gpu_dtype()  # (its deprecation warning, as torch's)
        return orig_dtype("cpu") if orig_enabled("cpu") else dtype

    torch.is_autocast_enabled = is_autocast_enabled  # type: ignore[assignment]
    torch.get_autocast_dtype = get_autocast_dtype  # type: ignore[assignment]
    torch.get_autocast_gpu_dtype = get_autocast_gpu_dtype  # type: ignore[assignment]
