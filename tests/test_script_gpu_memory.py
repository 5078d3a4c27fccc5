"""The simulated GPUs' memory figures (`rank.gpu_allocator`, fed by `rank.gpu_memory`):
`torch.cuda.memory_allocated`, `max_memory_allocated`, `memory_reserved`, `memory_stats`,
`empty_cache`, as CUDA's caching allocator gives them (c10/cuda/CUDACachingAllocator.cpp);
and `torch.cuda.device("cuda")`, which names the current device."""

from __future__ import annotations

import pytest

from tests.test_script_examples import _verdict, differences
from tests.test_script_modern_apis import _both
from tests.test_script_user_idioms import _keep, _keyed

MiB = 2**20


@pytest.fixture
def simulated_gpus(monkeypatch):
    """torch.cuda shimmed for 4 simulated GPUs and the rank layer's mode entered, in-process,
    restored after the test."""
    import torch
    import torch.accelerator
    import torch.cuda.memory
    import torch.cuda.random

    from simdist.script.rank import cuda_init, devices, gpu_allocator, gpu_memory, gpu_shims

    _keep(monkeypatch, torch.Tensor, torch.UntypedStorage, inherited=("resize_",))
    _keep(monkeypatch, torch.cuda, torch.cuda.memory, torch.cuda.random, torch.cuda.nvtx, torch.cuda.nccl,
          torch.accelerator, gpu_shims._Gpus, cuda_init._Init)
    for name in ("_cuda_memoryStats", "_cuda_resetPeakMemoryStats", "_cuda_resetAccumulatedMemoryStats",
                 "_cuda_emptyCache"):
        monkeypatch.setattr(torch._C, name, None, raising=False)  # (undone: deleted again)
    monkeypatch.setattr(gpu_allocator, "_DEVICES", {})
    monkeypatch.setattr(torch._C, "_get_accelerator", torch._C._get_accelerator)
    cuda_init.fresh_process()
    gpu_shims.install(4)
    gpu_memory._install_resizes()
    with devices.CudaToCpu():
        yield torch


def _figures(torch, device=None):
    return (torch.cuda.memory_allocated(device), torch.cuda.max_memory_allocated(device),
            torch.cuda.memory_reserved(device), torch.cuda.max_memory_reserved(device))


def test_memory_figures_follow_the_caching_allocators_rules(simulated_gpus):
    """Known requests, the figures the allocator's rules give: 4000 B -> a 4096 B block
    (`round_size`) of a 2 MiB segment (`get_allocation_size`), a second one split from the same
    segment, a freed block stays reserved, a 12 MB request gets a 12 MiB segment that is not
    split (< 1 MiB would remain: `should_split`) and counts whole, `empty_cache` gives back only
    unsplit free segments, `reset_peak_memory_stats` starts the peaks again, each device its own."""
    torch = simulated_gpus
    assert _figures(torch, 0) == (0, 0, 0, 0) and torch.cuda.memory_stats(0) == {}  # CUDA not initialised
    a = torch.empty(1000, device="cuda")
    assert _figures(torch) == (4096, 4096, 2 * MiB, 2 * MiB)
    b = torch.empty(1000, device="cuda")
    del a
    stats = torch.cuda.memory_stats()
    assert _figures(torch) == (4096, 8192, 2 * MiB, 2 * MiB)
    assert (stats["segment.all.current"], stats["inactive_split.all.current"], stats["allocation.all.current"]) == (1, 2, 1)
    big = torch.empty(3_000_000, device="cuda")  # 12_000_000 B -> 12_000_256 B rounded, a 12 MiB segment
    assert _figures(torch) == (4096 + 12 * MiB, 4096 + 12 * MiB, 14 * MiB, 14 * MiB)
    assert torch.cuda.memory_stats()["requested_bytes.all.current"] == 4000 + 12_000_000
    mid = torch.empty(300_000, device="cuda")  # 1.2 MB: a large request, split from a new 20 MiB segment
    assert torch.cuda.memory_stats()["reserved_bytes.large_pool.current"] == 32 * MiB
    del big, mid
    assert torch.cuda.memory_reserved() == 34 * MiB
    torch.cuda.empty_cache()
    assert _figures(torch) == (4096, 4096 + 12 * MiB + 1_200_128, 2 * MiB, 34 * MiB)
    assert torch.cuda.mem_get_info() == (80 * 2**30 - 2 * MiB, 80 * 2**30)
    torch.cuda.reset_peak_memory_stats()
    assert _figures(torch) == (4096, 4096, 2 * MiB, 2 * MiB)
    torch.cuda.set_device(2)
    c = torch.ones(4, 4, device="cuda") @ torch.ones(4, 4, device="cuda")  # the inputs are freed: one 512 B block left
    assert torch.cuda.memory_allocated() == torch.cuda.memory_allocated("cuda:2") == 512
    assert torch.cuda.memory_allocated(0) == 4096 and torch.accelerator.memory_allocated(2) == 512
    assert "PyTorch CUDA memory summary, device ID 2" in torch.cuda.memory_summary()
    del b, c


def test_a_resized_gpu_storage_is_reallocated(simulated_gpus):
    """FSDP frees an unsharded parameter with `untyped_storage().resize_(0)` and allocates it
    again with `resize_(n)`; a CUDA storage's resize allocates new memory and frees the old, and
    `Tensor.resize_` grows its storage so (`gpu_memory._resized`)."""
    torch = simulated_gpus
    t = torch.empty(1000, device="cuda")
    assert torch.cuda.memory_allocated() == 4096
    t.untyped_storage().resize_(0)
    assert torch.cuda.memory_allocated() == 0 and torch.cuda.max_memory_allocated() == 4096
    t.untyped_storage().resize_(4000)
    assert torch.cuda.memory_allocated() == 4096
    t.resize_(2000)  # 8000 B: a new 8192 B block, then the old one freed
    assert torch.cuda.memory_allocated() == 8192 and torch.cuda.max_memory_allocated() == 4096 + 8192
    t.resize_(10)  # shrinking keeps the storage
    assert torch.cuda.memory_allocated() == 8192
    del t
    assert torch.cuda.memory_allocated() == 0


def test_cuda_device_without_an_index_is_the_current_device(simulated_gpus):
    """torch reads `torch.cuda.device(d)` with `_get_device_index(d, optional=True)`: "cuda" is
    the current device (it selected device 0); `set_device("cuda")` is torch's ValueError."""
    torch = simulated_gpus
    torch.cuda.set_device(2)
    for device in ("cuda", torch.device("cuda"), None):
        with torch.cuda.device(device):
            assert torch.cuda.current_device() == 2
    with torch.cuda.device("cuda:3"):
        assert torch.cuda.current_device() == 3
    assert torch.cuda.current_device() == 2
    with pytest.raises(ValueError, match="Expected a torch.device with a specified index or an integer, but got:cuda"):
        torch.cuda.set_device("cuda")
    torch.cuda.set_device(torch.device("cuda:1"))
    assert torch.cuda.current_device() == 1


@pytest.mark.real
def test_gpu_memory_figures_agree_with_real_gloo(script_zygote):
    """tests/scripts/gpu_memory_stats.py: both sides run the same rank layer, so both print the
    simulated allocator's figures; they agree line for line, and say what the allocator's rules
    give for the known requests (each printed 0 before)."""
    sim, real = _both("gpu_memory_stats.py", 2, script_zygote)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    for rank in (0, 1):
        got = _keyed(sim.ranks[rank].output)
        assert got["start"] == "(0, 0, 0, 0, 0, 0)"
        assert got["small"] == f"(4096, 4096, {2 * MiB}, {2 * MiB}, 1, 0)"
        b = 4096 * (rank + 1)
        assert got["big"] == f"(({b + 12 * MiB}, {b + 12 * MiB}, {14 * MiB}, {14 * MiB}, 2, 0), {4000 * (rank + 1) + 12_000_000})"
        assert got["empty_cache"].startswith(f"(({b}, {b + 12 * MiB}, {2 * MiB}, {14 * MiB}, 1, 0), ")
        assert got["other device"] == "0"


def test_memory_stats_has_every_key_torch_documents(simulated_gpus):
    """Every statistic the installed torch's `memory_stats` docstring lists is a key of the
    simulated one (a private pools' dict only while a pool exists, none here). The docstring
    calls the allocation count "allocated"; torch's binding names it "allocation"
    (torch/csrc/cuda/Module.cpp `THCPModule_memoryStats`)."""
    import re

    torch = simulated_gpus
    documented = set(re.findall(r'``"([a-z_]+)[".{]', torch.cuda.memory.memory_stats.__doc__))
    documented = (documented - {"_", "allocated"}) | {"allocation"}  # ("_": the doc's tuple-key joiner)
    torch.empty(1, device="cuda")
    keys = {key.split(".")[0] for key in torch.cuda.memory_stats()}
    assert documented - keys == {"reserved_bytes_by_private_pools"}, documented - keys
    assert len(documented) >= 17 and set(torch.cuda.memory_stats_as_nested_dict()) == documented


def test_the_allocator_model_keeps_its_invariants():
    """`gpu_allocator.DeviceAllocator` under 3000 random requests and frees (sizes across the
    small, the 1-10 MiB and the large classes), with `empty_cache` now and then: each segment's
    blocks tile it, no two free neighbours are left unmerged, every cached free block is in its
    pool, and the statistics are the sums of the blocks (allocated, requested, segments,
    reserved, inactive split blocks) with peaks never below the current values."""
    import random

    from simdist.script.rank import gpu_allocator as ga

    rng = random.Random(0)
    alloc = ga.DeviceAllocator(0)
    live: list[ga.Block] = []
    for step in range(3000):
        if live and rng.random() < 0.45:
            alloc.free(live.pop(rng.randrange(len(live))))
        else:
            size = rng.choice([rng.randint(1, 4096), rng.randint(4096, ga.SMALL_SIZE),
                               rng.randint(ga.SMALL_SIZE, 12 * 2**20), rng.randint(12 * 2**20, 40 * 2**20)])
            live.append(alloc.malloc(size))
        if step % 500 == 499:
            alloc.empty_cache()
        free = {id(b) for pool in (alloc.small, alloc.large) for _, _, b in pool.free}
        heads = {}
        for block in live + [b for pool in (alloc.small, alloc.large) for _, _, b in pool.free]:
            head = block
            while head.prev is not None:
                head = head.prev
            heads[id(head)] = head
        total = 0
        for head in heads.values():
            ptr, block = head.ptr, head
            while block is not None:
                assert block.ptr == ptr and block.size >= ga.MIN_BLOCK and block.size % ga.MIN_BLOCK == 0
                assert block.allocated == (id(block) not in free)
                if block.next is not None:
                    assert block.next.prev is block and (block.allocated or block.next.allocated)
                ptr += block.size
                block = block.next
            total += ptr - head.ptr
        stats = alloc.stats()
        assert stats["reserved_bytes"]["all"]["current"] == total == alloc.reserved()
        assert stats["segment"]["all"]["current"] == len(heads)
        assert stats["allocated_bytes"]["all"]["current"] == sum(b.size for b in live)
        assert stats["requested_bytes"]["all"]["current"] == sum(b.requested for b in live)
        assert stats["allocation"]["all"]["current"] == len(live)
        split_free = [b for pool in (alloc.small, alloc.large) for _, _, b in pool.free if b.is_split()]
        assert stats["inactive_split"]["all"]["current"] == len(split_free)
        assert stats["inactive_split_bytes"]["all"]["current"] == sum(b.size for b in split_free)
        for name in ("allocated_bytes", "reserved_bytes", "segment", "allocation"):
            for pool in ("all", "small_pool", "large_pool"):
                s = stats[name][pool]
                assert s["peak"] >= s["current"] >= 0 and s["allocated"] - s["freed"] == s["current"]


def test_a_gpu_tensor_received_through_a_queue_is_the_senders_memory(simulated_gpus, monkeypatch):
    """A receiver maps the sender's block (CUDA IPC): its own allocator is not asked for it, so
    its `memory_allocated` does not grow (`gpu_memory.rebuild_on_gpu`); it is still on the GPU."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing.reductions as reductions

    from simdist.script.rank import gpu_memory

    torch = simulated_gpus
    monkeypatch.setattr(ForkingPickler, "_extra_reducers", dict(ForkingPickler._extra_reducers))
    gpu_memory._install_sharing()
    sent = torch.arange(3.0, device="cuda:1")
    assert torch.cuda.memory_allocated(1) == 512
    wire = ForkingPickler.dumps(sent)
    reductions.shared_cache.clear()
    got = ForkingPickler.loads(wire)
    assert gpu_memory.gpu_index(got) == 1 and got.tolist() == [0.0, 1.0, 2.0]
    assert torch.cuda.memory_allocated(1) == 512
    product = got * 2  # a result of a received tensor is the receiver's own memory
    assert gpu_memory.gpu_index(product) == 1 and torch.cuda.memory_allocated(1) == 1024
