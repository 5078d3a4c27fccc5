"""The wrappers that take a device from a GPU script (DDP, FSDP, FSDP2, a barrier's device) are
given the CPU the simulated GPUs stand for (`simdist.script.rank.devices` remaps the rest).

Why a module of its own: each rewrites a wrapper's arguments or a torch function it asks,
not a tensor's placement, and `devices` had reached the house's 450 lines.
"""

from __future__ import annotations

import functools
import inspect
from collections.abc import Callable
from typing import Any

import torch

from simdist.script.rank.device_args import CPU as _CPU
from simdist.script.rank.device_args import is_accelerator


def place_fsdp2_on_cpu(fully_shard_module: Any) -> None:
    """FSDP2 (`fully_shard`) on a "cuda" mesh places its shards on the CPU: it takes the mesh's
    device as the one every parameter must be on and asserted "Expects the parameter to
    already be moved to device cuda:0 but got cpu" (a GPU script's `init_device_mesh("cuda")`
    with the model built or moved on cuda). Given `torch.distributed.fsdp._fully_shard.
    _fully_shard`, which holds the function it asks."""
    orig = fully_shard_module._get_device_from_mesh

    @functools.wraps(orig)
    def _get_device_from_mesh(mesh: Any) -> torch.device:
        return _CPU if is_accelerator(mesh.device_type) else orig(mesh)

    fully_shard_module._get_device_from_mesh = _get_device_from_mesh


def place_fsdp_on_cpu(fsdp_module: Any) -> None:
    """FSDP (`FullyShardedDataParallel`) of a GPU script's module, given no `device_id` or a
    CUDA one, runs on the CPU the simulated GPUs stand for: the module is on the CPU (its
    `.to(rank)` remapped), and FSDP, finding no parameter off the CPU, asked torch for a
    non-CPU accelerator and raised "FSDP needs a non-CPU accelerator device" on both sides
    (the DCP recipe, the FSDP tutorial unedited). Given `torch.distributed.fsdp.
    fully_sharded_data_parallel` once the script imports it (importing FSDP costs ~1 s)."""
    def on_cpu(arguments: dict[str, Any]) -> None:
        device_id = arguments.get("device_id")
        if device_id is None or is_accelerator(device_id):
            arguments["device_id"] = _CPU

    _rewrite_init(fsdp_module.FullyShardedDataParallel, on_cpu)


def _rewrite_init(cls: type, rewrite: Callable[[dict[str, Any]], None]) -> None:
    """`cls.__init__`, its arguments bound by name and edited by `rewrite` first (a wrapper's devices)."""
    orig = cls.__init__
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def __init__(self: Any, *args: Any, **kwargs: Any) -> None:
        bound = sig.bind(self, *args, **kwargs)
        rewrite(bound.arguments)
        orig(*bound.args, **bound.kwargs)

    cls.__init__ = __init__  # type: ignore[method-assign]


def _patch_barrier_device() -> None:
    """A barrier's device (`BarrierOptions.device`) is the CPU: torch picks it from
    `barrier(device_ids=[r])` and the accelerator, which is "cuda" (`gpu_shims`), and a
    process group then makes its barrier tensor there, which failed on real Gloo's ranks
    ("Could not run 'aten::empty.memory_format' with arguments from the 'CUDA' backend")."""
    from torch._C._distributed_c10d import ProcessGroup

    orig = ProcessGroup.barrier

    @functools.wraps(orig)
    def barrier(self: Any, *args: Any, **kwargs: Any) -> Any:
        opts = kwargs.get("opts", args[0] if args else None)
        if opts is not None and is_accelerator(getattr(opts, "device", None)):
            opts.device = _CPU
        return orig(self, *args, **kwargs)

    ProcessGroup.barrier = barrier  # type: ignore[method-assign]


def _patch_ddp() -> None:
    from torch.nn.parallel import DistributedDataParallel as DDP

    def on_cpu(arguments: dict[str, Any]) -> None:
        module = arguments.get("module")
        if module is not None and all(p.device.type == "cpu" for p in module.parameters()):
            arguments.update({name: None for name in ("device_ids", "output_device") if name in arguments})

    _rewrite_init(DDP, on_cpu)


def install() -> None:
    """DDP's devices and barriers' devices (FSDP's and FSDP2's: `place_fsdp_on_cpu`,
    `place_fsdp2_on_cpu`, once the script imports them)."""
    _patch_ddp()
    _patch_barrier_device()
