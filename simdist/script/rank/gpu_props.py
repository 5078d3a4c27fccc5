"""What a simulated GPU says of itself (`torch.cuda.get_device_properties`): one fixed device.

Why a module of its own: scripts log the properties and pick features by them, and torch's
own code reads many more of them (inductor's cache key, its GPU heuristics); the full set
of fields torch binds is long, and `gpu_shims` only hands the one answer out.
"""

from __future__ import annotations

import dataclasses
import functools
import uuid as _uuid

from simdist.script.rank import gpu_allocator

# The PCI bus of each of a DGX A100's 8 GPUs (`nvidia-smi`: 00000000:07:00.0, ...): a node of
# more GPUs continues in the next PCI domain.
_DGX_BUSES = (0x07, 0x0F, 0x47, 0x4E, 0x87, 0x90, 0xB7, 0xBD)


class CUuuid:
    """A device's UUID as torch binds CUDA's `CUuuid` (`torch._C._CUuuid`): `str()` of it is
    the 8-4-4-4-12 hex form `nvidia-smi -L` shows after "GPU-", `.bytes` its 16 bytes as ints."""

    __slots__ = ("_raw",)

    def __init__(self, raw: bytes):
        self._raw = raw

    @property
    def bytes(self) -> list[int]:
        return list(self._raw)

    def __str__(self) -> str:
        return str(_uuid.UUID(bytes=self._raw))


@dataclasses.dataclass(frozen=True)
class DeviceProperties:
    """What `torch.cuda.get_device_properties` tells a script of a simulated GPU: scripts log
    its name and memory and decide features by its compute capability, and torch's own code
    reads the rest (inductor's cache key asks `gcnArchName`, its GPU heuristics the SM and
    thread limits; each missing one was an AttributeError where a GPU run reads a number).
    One A100-SXM4-80GB's answer (CUDA's `cudaDeviceProp` for it: compute capability 8.0,
    108 SMs, 40 MiB L2, 164 KiB shared memory per SM, 163 KiB per block opted in), fixed so
    that what a script prints is a function of the program. The fields are those torch's
    `_CudaDeviceProperties` binds (torch/_C/__init__.pyi, torch/csrc/cuda/Module.cpp); the
    UUID and the PCI ids name one board, so they are each simulated GPU's own (`of`)."""

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
    uuid: CUuuid = dataclasses.field(default_factory=lambda: CUuuid(bytes(16)))
    pci_bus_id: int = _DGX_BUSES[0]
    pci_device_id: int = 0
    pci_domain_id: int = 0

    def __repr__(self) -> str:
        """As torch prints a CUDA device's (`_CudaDeviceProperties.__repr__`, Module.cpp)."""
        return (f"_CudaDeviceProperties(name='{self.name}', major={self.major}, minor={self.minor}, "
                f"total_memory={self.total_memory // 2**20}MB, multi_processor_count="
                f"{self.multi_processor_count}, uuid={self.uuid}, pci_bus_id={self.pci_bus_id}, "
                f"pci_device_id={self.pci_device_id}, pci_domain_id={self.pci_domain_id}, "
                f"L2_cache_size={self.L2_cache_size // 2**20}MB)")

    @property
    def gcnArchName(self) -> str:  # noqa: N802 (torch's name)
        """ROCm's architecture name; a CUDA build binds it to `name` (torch/csrc/cuda/Module.cpp:
        "HIP-only property; reuse name attribute for CUDA builds")."""
        return self.name


@functools.cache
def of(index: int) -> DeviceProperties:
    """Simulated GPU `index`'s properties: the fixed device's, with a UUID of its own (the same
    in every run, so that what a script prints is a function of the program) and its place on
    a DGX A100's PCI buses. torch hands out one object per device (a reference to its
    `cudaDeviceProp`), so `of` does too."""
    raw = _uuid.uuid5(_uuid.NAMESPACE_URL, f"simdist:gpu:{index}").bytes
    return DeviceProperties(uuid=CUuuid(raw), pci_bus_id=_DGX_BUSES[index % len(_DGX_BUSES)],
                            pci_domain_id=index // len(_DGX_BUSES))
