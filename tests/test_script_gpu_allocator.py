"""The simulated CUDA caching allocator (`rank.gpu_allocator`) where Python differs from C++:
garbage collection runs finalizers (a storage's free, a library's `torch.cuda.empty_cache()`)
inside the allocator, a forked child inherits a lock another thread held; and what feeds it
(`rank.gpu_memory`, the storage moves of `rank.devices`): memory never changes device, a move
copies, as c10/cuda/CUDACachingAllocator.cpp and torch/storage.py have it."""

from __future__ import annotations

import gc
import os
import random
import signal
import threading

import pytest

from simdist.script.rank import gpu_allocator as ga
from tests import test_script_gpu_memory as gpu_memory_tests
from tests.test_script_gpu_memory import check_invariants
from tests.test_script_user_idioms import _keep

MiB = 2**20
simulated_gpus = gpu_memory_tests.simulated_gpus  # (the fixture, shared)


def _size(rng: random.Random) -> int:
    return rng.choice([rng.randint(1, 4096), rng.randint(4096, ga.SMALL_SIZE), rng.randint(ga.SMALL_SIZE, 12 * MiB),
                       rng.randint(12 * MiB, 40 * MiB)])


def test_finalizers_run_by_a_collection_inside_the_allocator_wait_until_it_leaves():
    """A collection can start at any allocation the allocator's Python makes (a `Block`, the
    tuples of a statistics change), and run finalizers there: a GPU storage's free, or a
    library's `__del__` calling `torch.cuda.empty_cache()`. Here a full collection runs at every
    statistics change (in the middle of a malloc's split, a free's merge, an empty_cache's walk
    over the cached segments) and garbage cycles' finalizers free blocks and empty the cache:
    400 mallocs, frees and empty_caches keep every invariant, and finalizers did arrive inside
    the allocator (else the test would prove nothing). Before, a nested `empty_cache` released
    segments an outer one was still walking, and `_Pool.remove` then dropped whichever block sat
    where the released one had been."""
    class Eager(ga.DeviceAllocator):
        collect = False

        def _change(self, *changes):  # (a collection here is one the interpreter may start anyway)
            if self.collect:
                gc.collect(0)
            super()._change(*changes)

    alloc = Eager(0)
    live: list[ga.Block] = []
    owned: list[ga.Block] = []  # blocks no finalizer will free
    inside = []

    class Holder:  # a storage's stand-in: in a cycle, so only a collection frees it
        def __init__(self, block: ga.Block, empty: bool):
            self.block, self.empty, self.me = block, empty, self

        def __del__(self) -> None:
            inside.append(alloc._busy)
            live.remove(self.block)
            alloc.free(self.block)
            if self.empty:
                alloc.empty_cache()

    rng = random.Random(1)
    gc.collect()
    gc.disable()  # collections only where `Eager` starts them: garbage waits for an operation
    try:
        for _ in range(400):
            alloc.collect = rng.random() < 0.3
            roll = rng.random()
            if roll < 0.5:
                block = alloc.malloc(_size(rng))
                live.append(block)
                if rng.random() < 0.6:
                    Holder(block, empty=rng.random() < 0.4)  # garbage at once
                else:
                    owned.append(block)
            elif roll < 0.8 and owned:
                block = owned.pop(rng.randrange(len(owned)))
                live.remove(block)
                alloc.free(block)
            else:
                alloc.empty_cache()
            alloc.collect = False
            check_invariants(alloc, live)
    finally:
        gc.enable()
    gc.collect()
    check_invariants(alloc, live)
    assert inside.count(True) > 20, inside


def test_pool_remove_refuses_a_block_it_does_not_hold():
    """`_Pool.remove` of a block that is not cached there raises, where it deleted whichever
    block sat at that place in the pool."""
    alloc = ga.DeviceAllocator(0)
    a, b = alloc.malloc(1000), alloc.malloc(3000)
    alloc.free(b)  # cached: the rest of the 2 MiB segment, merged
    stranger = ga.Block(a.size, a.ptr, True)
    with pytest.raises(AssertionError, match="is not cached in its pool"):
        alloc.small.remove(stranger)
    assert len(alloc.small.free) == 1
    check_invariants(alloc, [a])


def test_a_child_forked_while_another_thread_holds_the_lock_can_free(monkeypatch):
    """A DataLoader worker is forked while another thread of the parent (a pin-memory thread,
    a prefetcher) is inside the allocator: the child's copy of the lock is held by a thread
    that does not exist there, and its first free of an inherited GPU storage hung. Each
    allocator's lock is made again in the child (`os.register_at_fork`): the child frees,
    allocates and reads its figures, within 20 s."""
    monkeypatch.setattr(ga, "_DEVICES", {})
    alloc = ga.device(0)
    inherited = alloc.malloc(5000)
    held, release = threading.Event(), threading.Event()

    def hold() -> None:
        with alloc._lock:
            held.set()
            release.wait(30)

    t = threading.Thread(target=hold)
    t.start()
    assert held.wait(10)
    pid = os.fork()
    if pid == 0:  # the child: exits 0 when all of it ran, is killed by the alarm if it hangs
        signal.alarm(20)
        try:
            alloc.free(inherited)
            block = alloc.malloc(100)
            ok = alloc.stats()["allocation"]["all"]["current"] == 1 and block.size == 512
        except BaseException:
            ok = False
        os._exit(0 if ok else 1)
    release.set()
    t.join()
    _, status = os.waitpid(pid, 0)
    assert os.waitstatus_to_exitcode(status) == 0
    assert alloc.stats()["allocation"]["all"]["current"] == 1  # the parent's block is its own


def test_empty_cache_empties_every_devices_cache(simulated_gpus):
    """c10's `emptyCache` calls each device's allocator, made for every device when CUDA is
    initialised: a device the process never used counts the call (`num_sync_all_streams`),
    and each used device gives back its unsplit cached segments."""
    torch = simulated_gpus
    a = torch.empty(1000, device="cuda:0")
    b = torch.empty(3_000_000, device="cuda:1")
    del a, b
    assert (torch.cuda.memory_reserved(0), torch.cuda.memory_reserved(1)) == (2 * MiB, 12 * MiB)
    torch.cuda.empty_cache()
    assert (torch.cuda.memory_reserved(0), torch.cuda.memory_reserved(1)) == (0, 0)
    assert [torch.cuda.memory_stats(d)["num_sync_all_streams"] for d in range(4)] == [1, 1, 1, 1]
    torch.accelerator.empty_cache()
    assert torch.cuda.memory_stats(3)["num_sync_all_streams"] == 2


@pytest.fixture
def with_moves(simulated_gpus, monkeypatch):
    """`simulated_gpus` with the rank layer's tensor and storage moves (`rank.devices`)."""
    import torch.storage

    from simdist.script.rank import devices

    monkeypatch.setattr(torch.storage, "_to", torch.storage._to)
    monkeypatch.setattr(torch.storage._StorageBase, "cpu", torch.storage._StorageBase.cpu)
    _keep(monkeypatch, torch.Tensor, inherited=("to", "cuda", "cpu", "numpy", "pin_memory"))
    monkeypatch.setattr(devices, "_MOVES", set(devices._MOVES))
    devices._patch_tensor_moves()
    devices._patch_storage_moves()
    return simulated_gpus


def test_a_move_to_another_gpu_copies_and_the_source_keeps_its_block(with_moves):
    """`x.to("cuda:1")`, `x.cuda(1)` and `x.untyped_storage().cuda(1)` of a cuda:0 tensor are
    new memory on cuda:1 (torch/storage.py `_to` returns the storage itself only when it is on
    that device already); the source stays on cuda:0 with its block. `storage.cuda()` of host
    memory is a copy (the host tensor stays a host tensor), `storage.cpu()` of GPU memory a
    host copy. Before, the storage moves re-marked the storage itself: cuda:0 said 0 bytes,
    the source read as cuda:1, a host tensor became a GPU one."""
    from simdist.script.rank import gpu_memory

    torch = with_moves
    x = torch.ones(1000, device="cuda:0")
    y, z = x.to("cuda:1"), x.cuda(1)
    s = x.untyped_storage().cuda(1)
    assert [gpu_memory.gpu_index(t) for t in (x, y, z)] == [0, 1, 1] and gpu_memory.storage_index(s) == 1
    assert s is not x.untyped_storage() and x.untyped_storage().cuda(0) is x.untyped_storage()
    assert (torch.cuda.memory_allocated(0), torch.cuda.memory_allocated(1)) == (4096, 3 * 4096)
    assert torch.frombuffer(bytearray(bytes(s)), dtype=torch.float32).tolist() == [1.0] * 1000
    host = torch.ones(10)
    moved = host.untyped_storage().cuda()
    assert gpu_memory.gpu_index(host) is None and gpu_memory.storage_index(moved) == 0
    back = x.untyped_storage().cpu()
    assert back is not x.untyped_storage() and gpu_memory.storage_index(back) is None
    del y, z, s
    assert (torch.cuda.memory_allocated(0), torch.cuda.memory_allocated(1)) == (4096 + 512, 0)


def test_gradients_count_from_the_backward_that_made_them(simulated_gpus, monkeypatch):
    """A leaf's `.grad` is made in C++ (`AccumulateGrad`), unseen by the rank layer's mode:
    it counted only once Python read `p.grad`, so `memory_allocated()` right after
    `loss.backward()` left out every gradient. Now backward places them on their leaves' GPUs
    (`rank.gpu_grads`): parameters 2 x 512 B, input 512, loss 512, then the two gradients
    (512 each) count before anything reads them; `inputs=` limits it to those leaves, a host
    leaf's gradient stays host memory, and `torch.autograd.grad`'s results are on their
    inputs' GPUs."""
    import torch.autograd

    from simdist.script.rank import gpu_grads, gpu_memory

    torch = simulated_gpus
    monkeypatch.setattr(torch.autograd, "backward", torch.autograd.backward)
    monkeypatch.setattr(torch.autograd, "grad", torch.autograd.grad)
    gpu_grads.install()
    m = torch.nn.Linear(8, 4, device="cuda:1")
    host = torch.ones(4, requires_grad=True)
    x = torch.randn(2, 8, device="cuda:1")
    assert torch.cuda.memory_allocated(1) == 3 * 512
    loss = (m(x) * host.sum()).sum()
    loss.backward()
    assert torch.cuda.memory_allocated(1) == 6 * 512 and torch.cuda.max_memory_allocated(1) >= 6 * 512
    assert [gpu_memory.gpu_index(p.grad) for p in m.parameters()] == [1, 1] and gpu_memory.gpu_index(host.grad) is None
    m.zero_grad(set_to_none=True)
    assert torch.cuda.memory_allocated(1) == 4 * 512
    m(x).sum().backward(inputs=[m.bias])
    assert m.weight.grad is None and torch.cuda.memory_allocated(1) == 5 * 512
    (g,) = torch.autograd.grad(m(x).sum(), [m.weight])
    assert gpu_memory.gpu_index(g) == 1 and torch.cuda.memory_allocated(1) == 6 * 512


def test_cuda_counts_as_initialised_as_torchs_does(simulated_gpus):
    """`torch.cuda.is_initialized()` was False whatever the script did on its GPUs (torch's flag
    was never set: torch's own `_lazy_init` cannot run on a CPU build), so library checks such as
    "CUDA was initialised before the fork" passed where a GPU's fail. Now it says what torch's
    does: False before, True after the first CUDA use; and torch's seed calls, which then run at
    once instead of being queued (`_lazy_call`), seed the generator the simulated GPUs draw
    from: a "cuda" tensor drawn after `torch.cuda.manual_seed(3)` is the one drawn after
    `torch.manual_seed(3)`."""
    torch = simulated_gpus
    assert not torch.cuda.is_initialized()
    kept = torch.empty(1, device="cuda")
    assert torch.cuda.is_initialized() and torch.cuda.memory_stats()["allocation.all.current"] == 1 and kept.numel()
    torch.manual_seed(3)
    a = torch.randn(3, device="cuda")
    torch.randn(5)
    torch.cuda.manual_seed(3)
    assert torch.equal(torch.randn(3, device="cuda"), a)
    torch.cuda.manual_seed_all(3)
    torch.cuda.seed_all()
    torch.cuda.manual_seed(3)
    assert torch.equal(torch.randn(3, device="cuda:1"), a)


def test_legacy_tensor_types_convert_as_on_a_gpu(with_moves, monkeypatch):
    """`x.type(torch.cuda.FloatTensor)` and its string form raised "Cannot initialize CUDA
    without ATen_cuda library". As torch's `type`: a CUDA type keeps a GPU tensor's device (the
    tensor itself when the dtype is the same), puts a host tensor on the current device as a
    copy; a CPU type of a GPU tensor is a host copy; what `.type()` then reads is the CUDA name."""
    from simdist.script.rank import device_view, gpu_memory, legacy_types

    torch = with_moves
    for name in device_view.VIEWS:  # (restored after the test, "type" included)
        monkeypatch.setattr(torch.Tensor, name, getattr(torch.Tensor, name))
    legacy_types.install()
    device_view.install()
    x = torch.ones(2, device="cuda:1")
    assert x.type(torch.cuda.FloatTensor) is x and x.type("torch.cuda.FloatTensor") is x
    d = x.type(torch.cuda.DoubleTensor)
    assert d.dtype == torch.float64 and gpu_memory.gpu_index(d) == 1 and d.type() == "torch.cuda.DoubleTensor"
    torch.cuda.set_device(2)
    h = torch.ones(2)
    g = h.type(torch.cuda.FloatTensor)
    assert g is not h and gpu_memory.gpu_index(g) == 2 and gpu_memory.gpu_index(h) is None
    back = x.type(torch.FloatTensor)
    assert gpu_memory.gpu_index(back) is None and back.type() == "torch.FloatTensor" and back.tolist() == [1.0, 1.0]
    assert x.type(torch.float16).dtype == torch.float16 and h.type(torch.DoubleTensor).dtype == torch.float64
