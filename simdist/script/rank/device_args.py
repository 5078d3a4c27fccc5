"""What a device argument names: a CUDA device (a simulated GPU, which one) or the host.

Why a module of its own: every patch that remaps CUDA to the CPU (`simdist.script.rank.devices`:
the torch-function mode, the tensor, module and storage moves, the wrappers' devices) reads a
script's device arguments the same way, and one reading keeps them agreeing: an int is an
accelerator index, `"cuda"` the current simulated GPU, and a CPU device torch's own code read
off a simulated GPU tensor (`simdist.script.rank.device_view`) that GPU.
"""

from __future__ import annotations

from typing import Any

import torch

from simdist.script.rank import compiled_moves, device_view, gpu_memory, gpu_shims, visible_gpus

CPU = torch.device("cpu")

compiling = torch.compiler.is_compiling


def is_accelerator(device: Any) -> bool:
    """Whether a device argument means a CUDA device (an int is an accelerator index; a device
    torch's own code read off a simulated GPU tensor is that GPU: `device_view.host_index`)."""
    if isinstance(device, bool):
        return False
    if isinstance(device, int):
        return True
    if isinstance(device, str):
        return device.startswith("cuda")
    if isinstance(device, torch.device):  # (not asked inside a compiled function: dynamo skips
        # device_view, and its devices there are its fake tensors' own, never one of those objects)
        return device.type == "cuda" or (device.type == "cpu" and not compiling()
                                         and device_view.host_index(device) is not None)
    return False


def remap_args(args: tuple) -> tuple:
    return tuple(CPU if is_accelerator(a) else a for a in args)


def stands_for_gpu(t: Any) -> bool:
    """Whether `t` is a CPU tensor that stands for a GPU tensor (its storage is GPU memory:
    `simdist.script.rank.gpu_memory`)."""
    return gpu_memory.gpu_index(t) is not None


def target_index(device: Any) -> int:
    """The simulated GPU a CUDA device argument names ("cuda": the current one); one the process
    does not see (`cuda:8` on an 8-GPU node, `cuda:2` under CUDA_VISIBLE_DEVICES=0,1) is CUDA's
    "invalid device ordinal", as placing a tensor there raises on a GPU."""
    if isinstance(device, torch.device):
        read_off = device_view.host_index(device) if device.type == "cpu" else None  # (`is_accelerator`)
        if read_off is not None:
            return read_off
        if device.index is None:
            return gpu_shims._Gpus.current
        index = device.index
    elif isinstance(device, str):
        return target_index(torch.device(device))
    else:
        index = int(device)
    visible_gpus.check_ordinal(index)
    return index


def move_target(args: tuple, kwargs: dict) -> Any:
    """The device (or tensor) a `Tensor.to`/`Module.to` call names (None: a dtype only)."""
    if "device" in kwargs:
        return kwargs["device"]
    if "other" in kwargs:
        return kwargs["other"]
    if args and isinstance(args[0], (str, int, torch.device, torch.Tensor)) and not isinstance(args[0], bool):
        return args[0]
    return None


def is_cpu(device: Any) -> bool:
    return (isinstance(device, str) and device.startswith("cpu")) or (
        isinstance(device, torch.device) and device.type == "cpu")


def graph_destination(target: Any) -> int | None:
    """Where `x.to(target)` traced by dynamo places its result (`compiled_moves.HOST`: the host),
    None where the call names no device of its own (a dtype, a tensor, meta) or a CPU device
    object: in a graph every tensor's `.device` is its CPU fake tensor's, so `x.to(y.device)`
    names the CPU whatever `y` is on, and only "cpu" written out (or `.cpu()`) is known to be
    the host (`compiled_moves`)."""
    if is_accelerator(target):
        return target_index(target)
    return compiled_moves.HOST if isinstance(target, str) and is_cpu(target) else None
