"""CUDA's caching allocator, modelled for the simulated GPUs: what `torch.cuda.memory_allocated`,
`max_memory_allocated`, `memory_reserved`, `memory_stats` and `empty_cache` answer.

Why a model of the allocator and not a sum of tensor sizes: scripts print these figures
(llm.c's "peak memory consumption"), and on a GPU they are the caching allocator's: every
request is rounded (`round_size`), served from the smallest cached free block that fits, split
when what is left is worth keeping, and memory is reserved in segments (`get_allocation_size`)
that stay reserved when freed until `empty_cache`. Those rules are deterministic, so they are
reproduced here as c10/cuda/CUDACachingAllocator.cpp (`DeviceCachingAllocator`) has them with
the default settings (no `PYTORCH_CUDA_ALLOC_CONF`: max_split_size unlimited, no power-of-two
rounding, no expandable segments, no memory fraction):

* `malloc`: size = `round_size` (>= 512 B, a multiple of 512); the pool is the small one for
  size <= 1 MiB, else the large one; `get_free_block` takes the smallest free block of the
  pool with size >= size (ties: the lowest address); else `alloc_block` reserves a segment of
  `get_allocation_size(size)` (2 MiB for a small request, 20 MiB below 10 MiB, else size
  rounded up to 2 MiB); if that would pass the device's memory, `release_cached_blocks` frees
  every unsplit cached segment and retries once (`num_alloc_retries`), then raises
  `torch.OutOfMemoryError` (`num_ooms`);
* `should_split`: a small block is split when >= 512 B remain, a large one when > 1 MiB
  remain (so a large request may get a block up to 1 MiB bigger: `allocated_bytes` counts
  the block's size, as `alloc_found_block` does);
* `free` -> `free_block`: the block merges with its free neighbours in its segment;
* every statistic of `DeviceStats` (`allocation`, `segment`, `active`, `inactive_split`,
  `*_bytes`, `requested_bytes`, per pool and "all") moves where the allocator moves it.

What is not modelled (the bound): one stream (the simulated streams are one: a block used on
a side stream is not held for it); segment addresses are handed out in increasing order (a
GPU's `cudaMalloc` may reuse a freed range's address, which only changes which of two equal
free blocks is taken); and which requests reach the allocator is the rank layer's business
(`gpu_memory`: storages that Python code sees).
"""

from __future__ import annotations

import bisect
import dataclasses
import os
import threading
from typing import Any

CAPACITY = 80 * 2**30  # a simulated GPU's memory (an A100-80GB's: `gpu_props.DeviceProperties`)

MIN_BLOCK = 512  # kMinBlockSize: all sizes are rounded to at least 512 bytes
SMALL_SIZE = 1048576  # kSmallSize: largest "small" allocation is 1 MiB
SMALL_BUFFER = 2097152  # kSmallBuffer: "small" allocations are packed in 2 MiB blocks
LARGE_BUFFER = 20971520  # kLargeBuffer: "large" allocations may be packed in 20 MiB blocks
MIN_LARGE_ALLOC = 10485760  # kMinLargeAlloc: allocations between 1 and 10 MiB may use kLargeBuffer
ROUND_LARGE = 2097152  # kRoundLarge: round up large allocations to 2 MiB

_POOLS = ("all", "small_pool", "large_pool")  # a statistic's rows (StatType: AGGREGATE, SMALL_POOL, LARGE_POOL)
# The statistics that move, by column. With one stream and no events a block is active exactly
# while it is allocated, so "active"/"active_bytes" are "allocation"/"allocated_bytes".
ALLOCATION, SEGMENT, INACTIVE_SPLIT, ALLOCATED_BYTES, RESERVED_BYTES, INACTIVE_SPLIT_BYTES, REQUESTED_BYTES = range(7)
_COLUMNS = {"allocation": ALLOCATION, "segment": SEGMENT, "active": ALLOCATION, "inactive_split": INACTIVE_SPLIT,
            "allocated_bytes": ALLOCATED_BYTES, "reserved_bytes": RESERVED_BYTES, "active_bytes": ALLOCATED_BYTES,
            "inactive_split_bytes": INACTIVE_SPLIT_BYTES, "requested_bytes": REQUESTED_BYTES}
_COUNTERS = ("num_alloc_retries", "num_ooms", "num_sync_all_streams", "num_device_alloc", "num_device_free")
_MAX_SPLIT_SIZE = -1  # stats.max_split_size: static_cast<int64_t>(SIZE_MAX), the default
_ZERO_STAT = {"current": 0, "peak": 0, "allocated": 0, "freed": 0}  # oversize_*: none with no max_split_size


def round_size(size: int) -> int:
    """The allocator's `round_size` (no `roundup_power2_divisions` configured)."""
    if size < MIN_BLOCK:
        return MIN_BLOCK
    return MIN_BLOCK * ((size + MIN_BLOCK - 1) // MIN_BLOCK)


def allocation_size(size: int) -> int:
    """The allocator's `get_allocation_size`: the segment reserved for a rounded request."""
    if size <= SMALL_SIZE:
        return SMALL_BUFFER
    if size < MIN_LARGE_ALLOC:
        return LARGE_BUFFER
    return ROUND_LARGE * ((size + ROUND_LARGE - 1) // ROUND_LARGE)


@dataclasses.dataclass(eq=False)
class Block:
    """A range of a segment: allocated to a storage, or cached free in its pool."""

    size: int
    ptr: int
    small: bool
    allocated: bool = False
    requested: int = 0
    prev: Block | None = None
    next: Block | None = None

    def is_split(self) -> bool:
        return self.prev is not None or self.next is not None


class _Pool:
    """A `BlockPool`'s free blocks, ordered as `BlockComparatorSize` orders them (one stream):
    by size, then address."""

    def __init__(self, small: bool):
        self.small = small
        self.free: list[tuple[int, int, Block]] = []

    def insert(self, block: Block) -> None:
        bisect.insort(self.free, (block.size, block.ptr, block))  # (size, ptr) is unique: never compares blocks

    def remove(self, block: Block) -> None:
        """`block` out of the pool; it must be there (a block dropped in its place would stay
        cached nowhere, or twice: say so, never corrupt the pool quietly)."""
        i = bisect.bisect_left(self.free, (block.size, block.ptr))
        if i == len(self.free) or self.free[i][2] is not block:
            raise AssertionError(f"simulated GPU allocator: block {block.ptr:#x} ({block.size} B) is not cached "
                                 f"in its pool")
        del self.free[i]

    def best_fit(self, size: int) -> Block | None:
        """`get_free_block`: the smallest free block of at least `size` bytes (lowest address
        among equals); taken out of the pool."""
        i = bisect.bisect_left(self.free, (size, -1))
        if i == len(self.free):
            return None
        return self.free.pop(i)[2]


class DeviceAllocator:
    """One simulated GPU's caching allocator (`DeviceCachingAllocator`, module docstring)."""

    def __init__(self, device: int, capacity: int = CAPACITY):
        self.device = device
        self.capacity = capacity
        self.small, self.large = _Pool(True), _Pool(False)
        # c10's `Stat` of each column and row, in four tables: current, peak, allocated (the
        # amount ever added), and `freed` kept as allocated - current + the current at the last
        # `reset_accumulated` (current = that + allocated - freed), so only increases pay for it
        self._cur = [[0] * 7 for _ in _POOLS]
        self._peak = [[0] * 7 for _ in _POOLS]
        self._added = [[0] * 7 for _ in _POOLS]
        self._base = [[0] * 7 for _ in _POOLS]
        self.counters = dict.fromkeys(_COUNTERS, 0)
        self._reserved = 0  # total_allocated_memory: what the segments take
        self._next_ptr = 0x7F0000000000  # segment addresses, handed out in increasing order
        self._lock = threading.RLock()
        # While this thread is inside the allocator (`_busy`), a free or an `empty_cache` that
        # arrives on it (a storage's finalizer, run by a garbage collection that an allocation in
        # here triggered, may free a block or call `torch.cuda.empty_cache()`) waits until it
        # leaves (`_drain`): run there, it would change the pools in the middle of an operation
        # (a nested `empty_cache` released the segments an outer one was still walking).
        self._busy = False
        self._deferred: list[Block] = []
        self._empty_pending = False

    def _change(self, small: bool, *changes: tuple[int, int]) -> None:
        """`increase_stat`/`decrease_stat` of each (column, amount) in the row "all" and the
        block's pool's row."""
        cur, peak, added = self._cur, self._peak, self._added
        for row in (0, 1 if small else 2):
            c = cur[row]
            for column, amount in changes:
                value = c[column] + amount
                c[column] = value
                if amount > 0:
                    added[row][column] += amount
                    if value > peak[row][column]:
                        peak[row][column] = value

    def malloc(self, orig_size: int) -> Block:
        """A block for a request of `orig_size` bytes (> 0), as `DeviceCachingAllocator::malloc`."""
        with self._lock:
            if self._busy:  # a finalizer's allocation inside the allocator: it cannot wait for a result
                return self._malloc(orig_size)
            self._busy = True
            try:
                return self._malloc(orig_size)
            finally:
                self._busy = False
                self._drain()

    def _malloc(self, orig_size: int) -> Block:
        size = round_size(orig_size)
        small = size <= SMALL_SIZE
        pool = self.small if small else self.large
        block = pool.best_fit(size)
        if block is None:
            alloc = allocation_size(size)
            block = self._alloc_block(alloc, small)
            if block is None:
                self._release_cached_blocks()
                self.counters["num_alloc_retries"] += 1
                block = self._alloc_block(alloc, small)
            if block is None:
                self.counters["num_ooms"] += 1
                raise self._out_of_memory(alloc)
        return self._alloc_found_block(block, pool, size, orig_size)

    def _alloc_block(self, alloc: int, small: bool) -> Block | None:
        """`alloc_block`: a new segment (None: `cudaMalloc` would fail, the device is full)."""
        if self._reserved + alloc > self.capacity:
            return None
        self._reserved += alloc
        block = Block(alloc, self._next_ptr, small)
        self._next_ptr += alloc
        self._change(small, (SEGMENT, 1), (RESERVED_BYTES, alloc))
        self.counters["num_device_alloc"] += 1
        return block

    def _alloc_found_block(self, block: Block, pool: _Pool, size: int, orig_size: int) -> Block:
        remaining = block.size - size
        split = remaining >= MIN_BLOCK if pool.small else remaining > SMALL_SIZE  # should_split
        already_split = block.is_split()
        if split:
            rest = block
            block = Block(size, rest.ptr, rest.small, prev=rest.prev, next=rest)
            if block.prev is not None:
                block.prev.next = block
            rest.prev = block
            rest.ptr += size
            rest.size -= size
            pool.insert(rest)
            if already_split:
                self._change(block.small, (INACTIVE_SPLIT_BYTES, -size))
            else:
                self._change(block.small, (INACTIVE_SPLIT_BYTES, rest.size), (INACTIVE_SPLIT, 1))
        elif already_split:
            self._change(block.small, (INACTIVE_SPLIT_BYTES, -block.size), (INACTIVE_SPLIT, -1))
        block.allocated, block.requested = True, orig_size
        size = block.size
        for row in (0, 1 if block.small else 2):  # (`_change` of three increases, unrolled: every malloc)
            c, p, a = self._cur[row], self._peak[row], self._added[row]
            c[ALLOCATION] += 1
            c[ALLOCATED_BYTES] += size
            c[REQUESTED_BYTES] += orig_size
            a[ALLOCATION] += 1
            a[ALLOCATED_BYTES] += size
            a[REQUESTED_BYTES] += orig_size
            if c[ALLOCATION] > p[ALLOCATION]:
                p[ALLOCATION] = c[ALLOCATION]
            if c[ALLOCATED_BYTES] > p[ALLOCATED_BYTES]:
                p[ALLOCATED_BYTES] = c[ALLOCATED_BYTES]
            if c[REQUESTED_BYTES] > p[REQUESTED_BYTES]:
                p[REQUESTED_BYTES] = c[REQUESTED_BYTES]
        return block

    def free(self, block: Block) -> None:
        """`free` of an allocated block (its storage is gone): cached in its pool, merged with
        its free neighbours. A free that arrives while this thread is inside the allocator (a
        storage collected during `malloc`) is done when it leaves."""
        with self._lock:
            if self._busy:
                self._deferred.append(block)
                return
            self._busy = True
            try:
                self._free(block)
            finally:
                self._busy = False
                self._drain()

    def _drain(self) -> None:
        """What waited while this thread was inside the allocator: the frees, then an `empty_cache`."""
        while self._deferred or self._empty_pending:
            self._busy = True
            try:
                if self._deferred:
                    self._free(self._deferred.pop())
                else:
                    self._empty_pending = False
                    self._release_cached_blocks()
            finally:
                self._busy = False

    def _free(self, block: Block) -> None:
        block.allocated = False
        original, requested = block.size, block.requested
        pool = self.small if block.small else self.large
        net_blocks = net_size = 0
        for other in (block.prev, block.next):
            subsumed = self._try_merge(block, other, pool)
            if subsumed:
                net_blocks -= 1
                net_size -= subsumed
        pool.insert(block)
        if block.is_split():
            net_blocks += 1
            net_size += block.size
        for row in (0, 1 if block.small else 2):  # (`_change` of three decreases, unrolled: every free)
            c = self._cur[row]
            c[ALLOCATION] -= 1
            c[ALLOCATED_BYTES] -= original
            c[REQUESTED_BYTES] -= requested
        if net_blocks or net_size:
            self._change(block.small, (INACTIVE_SPLIT, net_blocks), (INACTIVE_SPLIT_BYTES, net_size))

    @staticmethod
    def _try_merge(dst: Block, src: Block | None, pool: _Pool) -> int:
        """`try_merge_blocks`: `src`, a free neighbour of `dst`, becomes part of it."""
        if src is None or src.allocated:
            return 0
        pool.remove(src)
        if dst.prev is src:
            dst.ptr, dst.prev = src.ptr, src.prev
            if dst.prev is not None:
                dst.prev.next = dst
        else:
            dst.next = src.next
            if dst.next is not None:
                dst.next.prev = dst
        dst.size += src.size
        return src.size

    def _release_cached_blocks(self) -> None:
        """`release_cached_blocks`: every cached segment that is not split is given back."""
        self.counters["num_sync_all_streams"] += 1
        for pool in (self.large, self.small):
            for _, _, block in [e for e in pool.free if not e[2].is_split()]:
                pool.remove(block)
                self._reserved -= block.size
                self.counters["num_device_free"] += 1
                self._change(block.small, (SEGMENT, -1), (RESERVED_BYTES, -block.size))

    def empty_cache(self) -> None:
        """`emptyCache` (done when this thread leaves the allocator, if it is inside: `_busy`)."""
        with self._lock:
            if self._busy:
                self._empty_pending = True
                return
            self._busy = True
            try:
                self._release_cached_blocks()
            finally:
                self._busy = False
                self._drain()

    def reserved(self) -> int:
        return self._reserved

    def reset_peak(self) -> None:
        """`resetPeakStats`."""
        with self._lock:
            self._peak = [list(row) for row in self._cur]

    def reset_accumulated(self) -> None:
        """`resetAccumulatedStats`."""
        with self._lock:
            self._added = [[0] * 7 for _ in _POOLS]
            self._base = [list(row) for row in self._cur]
            self.counters = dict.fromkeys(_COUNTERS, 0)

    def current(self, column: int, row: int = 0) -> int:
        return self._cur[row][column]

    def stats(self) -> dict[str, Any]:
        """`torch._C._cuda_memoryStats(device)`'s nested dict (torch/csrc/cuda/Module.cpp), with
        the keys torch 2.13's `memory_stats` documents (torch/cuda/memory.py)."""
        with self._lock:
            busy, self._busy = self._busy, True  # one moment's figures: a free collected meanwhile waits
            try:
                out: dict[str, Any] = {**self.counters, "max_split_size": _MAX_SPLIT_SIZE}
                for name, column in _COLUMNS.items():
                    out[name] = {pool: self._stat(row, column) for row, pool in enumerate(_POOLS)}
            finally:
                self._busy = busy
                if not busy:
                    self._drain()
            out["oversize_allocations"], out["oversize_segments"] = dict(_ZERO_STAT), dict(_ZERO_STAT)
            out["num_oom_rejections"] = 0  # (a per-process memory fraction's: none is set)
            out["reserved_bytes_by_private_pools"] = {}  # (no CUDA graph's or MemPool's pools)
            return out

    def _stat(self, row: int, column: int) -> dict[str, int]:
        current, added = self._cur[row][column], self._added[row][column]
        return {"current": current, "peak": self._peak[row][column], "allocated": added,
                "freed": self._base[row][column] + added - current}

    def _out_of_memory(self, alloc: int) -> Exception:
        """torch's "CUDA out of memory" error (`malloc`), with the figures of this device."""
        import torch

        allocated = self._cur[0][ALLOCATED_BYTES]
        return torch.OutOfMemoryError(
            f"CUDA out of memory. Tried to allocate {format_size(alloc)}. GPU {self.device} has a total capacity "
            f"of {format_size(self.capacity)} of which {format_size(self.capacity - self._reserved)} is free. "
            f"Of the allocated memory {format_size(allocated)} is allocated by PyTorch, and "
            f"{format_size(self._reserved - allocated)} is reserved by PyTorch but unallocated. If reserved but "
            "unallocated memory is large try setting PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True to avoid "
            "fragmentation.  See documentation for Memory Management  "
            "(https://pytorch.org/docs/stable/notes/cuda.html#environment-variables)")


def format_size(size: int) -> str:
    """c10's `format_size` (CUDACachingAllocator.cpp): bytes, KiB, MiB or GiB, two decimals."""
    if size <= 1024:
        return f"{size} bytes"
    if size <= 1048576:
        return f"{size / 1024:.2f} KiB"
    if size <= 1073741824:
        return f"{size / 1048576:.2f} MiB"
    return f"{size / 1073741824:.2f} GiB"


_DEVICES: dict[int, DeviceAllocator] = {}


def device(index: int) -> DeviceAllocator:
    """Simulated GPU `index`'s allocator (made on its first use)."""
    return _DEVICES.get(index) or _DEVICES.setdefault(index, DeviceAllocator(index))


def used() -> bool:
    """Whether any simulated GPU has been asked for memory in this process."""
    return bool(_DEVICES)


def empty_all(count: int) -> None:
    """`emptyCache` of c10's `NativeCachingAllocator`: every device's allocator empties its
    cache (`device_allocator`, made for each of the `count` devices when CUDA is initialised,
    whether the process used it or not: each one's `num_sync_all_streams` counts the call)."""
    for index in range(count):
        device(index).empty_cache()


def reset() -> None:
    """No memory on any simulated GPU (a process that starts as a new interpreter)."""
    _DEVICES.clear()


def _after_fork_in_child() -> None:
    """A forked child (a DataLoader worker) has one thread: a lock that another thread of the
    parent held at the fork would be held forever, and the child's first free of a GPU storage
    it inherited would hang. Each allocator gets a new lock, as at its start."""
    for allocator in _DEVICES.values():
        allocator._lock = threading.RLock()
        allocator._busy = False


os.register_at_fork(after_in_child=_after_fork_in_child)
