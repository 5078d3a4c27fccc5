"""What a simulated GPU says of itself (`torch.cuda.get_device_properties`): one fixed device.

Why a module of its own: scripts log the properties and pick features by them, and torch's
own code reads many more of them (inductor's cache key, its GPU heuristics); the full set
of fields torch binds is long, and `gpu_shims` only hands the one answer out.
"""

from __future__ import annotations

import dataclasses

from simdist.script.rank import gpu_allocator


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What `torch.cuda.get_device_properties` tells a script of a simulated GPU: scripts log
    its name and memory and decide features by its compute capability, and torch's own code
    reads the rest (inductor's cache key asks `gcnArchName`, its GPU heuristics the SM and
    thread limits; each missing one was an AttributeError where a GPU run reads a number).
    One A100-SXM4-80GB's answer (CUDA's `cudaDeviceProp` for it: compute capability 8.0,
    108 SMs, 40 MiB L2, 164 KiB shared memory per SM, 163 KiB per block opted in), fixed so
    that what a script prints is a function of the program. The fields are those torch's
    `_CudaDeviceProperties` binds (torch/_C/__init__.pyi, torch/csrc/cuda/Module.cpp) but
    `uuid` and the PCI ids, which name one physical board."""

    name: str = "simdist simulated GPU (CPU)"
    major: int = 8
    minor: int = 0
    total_memory: int = gpu_allocator.CAPACITY
    multi_processor_count: int = 108
    is_integrated: bool = False
    is_multi_gpu_board: bool = False
    max_threads_per_multi_processor: int = 2048
    max_threads_per_block: int = 1024
    warp_size: int = 32
    regs_per_multiprocessor: int = 65536
    shared_memory_per_block: int = 48 * 1024
    shared_memory_per_block_optin: int = 163 * 1024
    shared_memory_per_multiprocessor: int = 164 * 1024
    L2_cache_size: int = 40 * 2**20
    clock_rate: int = 1_410_000  # kHz
    memory_clock_rate: int = 1_593_000  # kHz
    memory_bus_width: int = 5120  # bits

    @property
    def gcnArchName(self) -> str:  # noqa: N802 (torch's name)
        """ROCm's architecture name; a CUDA build binds it to `name` (torch/csrc/cuda/Module.cpp:
        "HIP-only property; reuse name attribute for CUDA builds")."""
        return self.name
