"""CUDA's initialisation state on simulated GPUs, as it matters across `fork`: torch's
`_lazy_init`, and the bad fork it leaves children in.

Why a module of its own: every shim that stands for a CUDA call which initialises the runtime
(`simdist.script.rank.gpu_shims`, the moves of `simdist.script.rank.devices`, received GPU
memory in `simdist.script.rank.gpu_memory`) calls `lazy_init` first, and this one state
decides what that does: a process that initialised CUDA, or only asked `is_available()`,
forks children in which CUDA cannot be initialised, as torch's own: their first CUDA use
raises torch's "Cannot re-initialize CUDA in forked subprocess" (a DataLoader worker's
collate that calls `.cuda()`, an `mp.Process` with the fork start method, `os.fork`); a child
forked before that, or started with spawn, uses its GPU.
"""

from __future__ import annotations

import os
from typing import Any

from simdist.script.rank import gpu_allocator, visible_gpus


class _Init:
    """torch's CUDA initialisation state, as it matters across `fork`.

    torch (torch/csrc/cuda/Module.cpp, torch/csrc/utils/device_lazy_init.cpp): the first
    CUDA call that needs the runtime goes through `device_lazy_init`, which calls
    `torch.cuda._lazy_init` (torch/cuda/__init__.py), which calls `torch._C._cuda_init`;
    that, and `_cuda_getDeviceCount` (behind `torch.cuda.is_available()`, "will poison fork"
    unless PYTORCH_NVML_BASED_CUDA_CHECK=1: its docstring), register a `pthread_atfork` child
    handler once per process (`poison_fork` / `register_fork_handler_for_device_init`). In a
    child forked after that, `torch._C._cuda_isInBadFork()` is true and CUDA counts as not
    initialised, so the child's first CUDA use calls `_lazy_init` again, which raises
    "Cannot re-initialize CUDA in forked subprocess. To use CUDA with multiprocessing, you
    must use the 'spawn' start method". `is_available()` and `device_count()` still answer
    there (the device count is cached in the process: c10/cuda/CUDAFunctions.cpp), and
    `torch.manual_seed` skips CUDA's generators (torch/random.py asks `_is_in_bad_fork`)."""

    initialized = False  # this process initialised CUDA (`lazy_init` passed)
    poisoned = False  # the fork handler is registered: children are bad forks
    bad_fork = False  # this process was forked after its parent's `poisoned`


def poison_fork() -> None:
    """What registers torch's fork handler (`_Init`)."""
    _Init.poisoned = True


def in_bad_fork() -> bool:
    """`torch.cuda._is_in_bad_fork()` (torch's `torch._C._cuda_isInBadFork`, absent from a CPU
    build: torch.cuda then said False in every child)."""
    return _Init.bad_fork


_TORCH_LAZY_INIT: Any = None  # torch's own `torch.cuda._lazy_init` (install)


def lazy_init() -> None:
    """CUDA initialised, as torch's `_lazy_init` does on a call that needs the runtime: in a
    bad fork torch's own `_lazy_init` runs, which raises its "Cannot re-initialize CUDA in
    forked subprocess" from torch/cuda/__init__.py (it asks `_is_in_bad_fork`, `in_bad_fork`
    here), every time, as there; elsewhere the process is initialised and poisons fork."""
    if _Init.initialized:
        return
    if _Init.bad_fork:
        _TORCH_LAZY_INIT()
    if visible_gpus.count() == 0:  # CUDA_VISIBLE_DEVICES names none of the node's GPUs
        raise RuntimeError(visible_gpus.NO_GPUS)
    visible_gpus.fix()
    _Init.initialized = _Init.poisoned = True
    _mark_torch(True)


def _mark_torch(initialized: bool) -> None:
    """torch's own flag (`torch.cuda._initialized`, which its `_lazy_init` sets): then
    `torch.cuda.is_initialized()` says True as on a GPU (and False in a bad fork, which it asks
    `_is_in_bad_fork` for), torch's `memory_stats`/`empty_cache` act, and `_lazy_call` runs a
    CUDA seed call at once instead of queueing it for an initialisation that never comes
    (`gpu_shims`: the CUDA generators are the CPU one)."""
    import torch.cuda

    torch.cuda._initialized = initialized


def _after_fork_in_child() -> None:
    """torch's fork handler (`_Init`): a child of a poisoned process is a bad fork, with CUDA
    not initialised."""
    if _Init.poisoned:
        _Init.bad_fork, _Init.initialized = True, False


def fresh_process() -> None:
    """A process that starts as a new interpreter would (a rank the zygote forks: what the
    zygote's own imports did is not the script's)."""
    _Init.initialized = _Init.poisoned = _Init.bad_fork = False
    _mark_torch(False)
    visible_gpus.unfix()
    gpu_allocator.reset()


def initialising(fn: Any) -> Any:
    """`fn` after `lazy_init`, as torch's function of that name initialises CUDA first."""
    def call(*args: Any, **kwargs: Any) -> Any:
        lazy_init()
        return fn(*args, **kwargs)
    return call


def install() -> None:
    """torch's fork handler registered, and torch's own `_lazy_init` kept: once per process
    (the handler cannot be taken back)."""
    global _TORCH_LAZY_INIT
    import torch.cuda as tc

    if _TORCH_LAZY_INIT is None:
        _TORCH_LAZY_INIT = tc._lazy_init
        os.register_at_fork(after_in_child=_after_fork_in_child)
