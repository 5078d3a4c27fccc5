"""Which of the node's simulated GPUs a process sees (`CUDA_VISIBLE_DEVICES`, as CUDA and torch
read it), and which of them it has selected.

Why a module of its own: on a GPU machine a user picks GPUs by `CUDA_VISIBLE_DEVICES=0,1 python
train.py` (rasbt/LLMs-from-scratch's `DDP-script.py` says to run it so), and a process sees
only those, renumbered from 0: `device_count()` is 2, `set_device(2)` raises CUDA's "invalid
device ordinal", and `CUDA_VISIBLE_DEVICES=""` leaves no GPU (`is_available()` False, the first
CUDA use torch's "No CUDA GPUs are available"). The simulated GPUs ignored the variable, so
such a run saw the node's 8. Every shim that counts or checks a GPU
(`simdist.script.rank.gpu_shims`, the placements of `simdist.script.rank.device_args`, CUDA's
initialisation in `simdist.script.rank.cuda_init`) asks here.

The reading is torch's own (`torch.cuda._parse_visible_devices`, then `_device_count_nvml`'s
trimming: the list ends at the first ordinal the node lacks; a repeated one, or an empty
variable, leaves none; `GPU-<uuid prefix>` entries name the simulated GPUs' UUIDs,
`gpu_props.of`). `MIG-` entries: the simulated A100s have MIG off, so they name no device.
torch reads the variable on each `device_count()` until CUDA is initialised and keeps the count
from then on (`_cached_device_count`; CUDA itself read it when it initialised): `fix`/`unfix`.
"""

from __future__ import annotations

import dataclasses
import os

from simdist.script.rank import gpu_props

# c10's message for cudaErrorInvalidDevice (c10/cuda/CUDAException.h, CUDAMiscFunctions.cpp),
# raised as torch.AcceleratorError by a CUDA build
INVALID_ORDINAL = ("CUDA error: invalid device ordinal\nGPU device may be out of range, do you have enough GPUs?\n"
                   "CUDA kernel errors might be asynchronously reported at some other API call, so the stacktrace "
                   "below might be incorrect.\nFor debugging consider passing CUDA_LAUNCH_BLOCKING=1\n"
                   "Compile with `TORCH_USE_CUDA_DSA` to enable device-side assertions.\n")
NO_GPUS = "No CUDA GPUs are available"  # torch's `_cuda_init` with none visible (CUDAHooks::init)


class Gpus:
    """The GPU this process has selected (`torch.cuda.set_device`, `current_device()`)."""

    current = 0


@dataclasses.dataclass
class _State:
    node: int = 8  # the node's GPUs (`--gpus-per-node`, `install`)
    fixed: list[int] | None = None  # the ordinals seen since CUDA was initialised (`fix`)


_STATE = _State()


def install(node_gpus: int) -> None:
    _STATE.node, _STATE.fixed = node_gpus, None


def _read() -> list[int]:
    """The node's GPU ordinals this process sees, in its own order, from the variable now."""
    return seen_of(_STATE.node)


def seen_of(node: int) -> list[int]:
    """The ordinals of a node of `node` simulated GPUs that the variable, as it is now, leaves
    visible, in the process's own order."""
    import torch.cuda as tc

    named = tc._parse_visible_devices()  # list(range(64)) when unset
    if named and isinstance(named[0], str):
        if named[0].startswith("MIG-"):
            return []
        uuids = [f"GPU-{gpu_props.of(i).uuid}" for i in range(node)]
        return tc._transform_uuid_to_ordinals(named, uuids)  # type: ignore[arg-type]
    seen: list[int] = []
    for ordinal in named:
        if int(ordinal) >= node:
            break
        seen.append(int(ordinal))
    return seen


def hidden_note(node: int) -> str | None:
    """What the run's report says when `CUDA_VISIBLE_DEVICES` in the environment the ranks
    inherit (this process's: the shell's, often exported on a GPU box, by a scheduler's job or
    to hide GPUs) leaves fewer than the simulated node's `node`: the ranks see only those, as on a GPU
    node, so a script that sizes its world by `torch.cuda.device_count()` runs fewer ranks,
    or none, with nothing else in the report to say why. None when it hides none."""
    value = os.environ.get("CUDA_VISIBLE_DEVICES")
    if value is None or node == 0 or (n := len(seen_of(node))) == node:
        return None
    return (f"CUDA_VISIBLE_DEVICES={value!r} (the run's environment) leaves each process {n} of the simulated "
            f"node's {node} GPUs (torch.cuda.device_count() {n}), as on a GPU node: unset it to see all {node}")


def ordinals() -> list[int]:
    return _STATE.fixed if _STATE.fixed is not None else _read()


def count() -> int:
    """`torch.cuda.device_count()`: the GPUs this process sees."""
    return len(ordinals())


def physical(index: int) -> int:
    """The node's ordinal of this process's GPU `index` (its UUID and PCI bus are that GPU's)."""
    seen = ordinals()
    return seen[index] if 0 <= index < len(seen) else index


def fix() -> None:
    """CUDA initialised: the GPUs seen stay those (a later change of the variable is not read)."""
    if _STATE.fixed is None:
        _STATE.fixed = _read()


def unfix() -> None:
    """A fresh process: the variable is read again until it initialises CUDA."""
    _STATE.fixed = None


def check_ordinal(index: int) -> None:
    """What CUDA does with a GPU index this process lacks: torch.AcceleratorError, "invalid
    device ordinal" (`set_device`, a tensor placed on `cuda:N`)."""
    if index >= count():
        import torch

        raise torch.AcceleratorError(INVALID_ORDINAL)
