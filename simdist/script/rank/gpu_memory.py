"""Which CPU memory stands for a simulated GPU's: a property of the tensor's storage, so that
every view, alias and result of an operation on a "GPU" tensor is one too.

Why the storage: on a GPU the device is a property of the memory. A host tensor moved to the
device is new memory, `.cpu()` of a device tensor is new host memory (torch's `Tensor.cpu`
is `to(kCPU)`, and `to` returns `self` only when nothing changes: aten/src/ATen/native/
TensorConversions.cpp `to_impl` / `_to_copy`), and a view, `p.data`, `p.detach()`, a
`state_dict()` value or a slice of a device tensor is on the device. Tracking the tensor
*objects* a move made missed all of those: `{k: v.cpu() for k, v in
model.state_dict().items()}`, a "best weights" snapshot, was the live parameters' memory
and followed the training.

How: torch keeps one Python object per storage for as long as the storage lives (PyObject
preservation: `t.untyped_storage()` is the same object for every view of `t`, and it lives
while any tensor uses the storage), so the device index is an attribute of that object
(`_ATTR`), dropped with the storage and shared by every alias, with no registry to sweep.
Results of operations inherit it in the rank layer's `TorchFunctionMode`
(`simdist.script.rank.devices.CudaToCpu`, which sees every torch call the script's Python
makes, and attribute reads such as `p.grad` too): an operation whose first tensor argument
is on a simulated GPU puts its tensor results there, as a GPU kernel would.
"""

from __future__ import annotations

import functools
import threading
from typing import Any

import torch

from simdist.script.rank import cuda_init, gpu_allocator

_ATTR = "_simdist_cuda_index"
_BLOCK = "_simdist_cuda_block"  # the storage's `_Allocation` on its simulated GPU
PLAIN = (torch.Tensor, torch.nn.Parameter)  # subclasses (DTensor, fake tensors) are left as they are


def gpu_index(t: Any) -> int | None:
    """The simulated GPU whose memory `t` uses (None: host memory, or not a plain tensor)."""
    if type(t) not in PLAIN:
        return None
    try:
        return getattr(t.untyped_storage(), _ATTR, None)
    except (RuntimeError, NotImplementedError):  # sparse, nested: no storage of their own
        return None


class _Allocation:
    """A storage's block in its simulated GPU's caching allocator (`gpu_allocator`), given
    back when the storage is gone: it is an attribute of the storage's Python object, which
    torch keeps exactly as long as the storage (module docstring), so it is collected with it,
    as the CUDA allocator's `free` runs when a storage's memory is released."""

    __slots__ = ("allocator", "block")

    def __init__(self, allocator: gpu_allocator.DeviceAllocator, block: gpu_allocator.Block):
        self.allocator, self.block = allocator, block

    def __del__(self) -> None:
        self.allocator.free(self.block)


def _place(storage: Any, index: int) -> None:
    """`storage` is on simulated GPU `index`: its bytes are requested from that GPU's allocator
    when it is new there (a storage of 0 bytes requests nothing: torch's CUDA allocator calls
    `malloc` only for a size != 0). A storage that is already there stays as it is (a view's
    result, an op's output aliasing its input)."""
    before = getattr(storage, _ATTR, None)
    if before == index:
        return
    nbytes = storage.nbytes()
    allocation = None
    if nbytes:
        allocator = gpu_allocator.device(index)
        allocation = _Allocation(allocator, allocator.malloc(nbytes))  # (may raise torch.OutOfMemoryError)
    setattr(storage, _ATTR, index)
    setattr(storage, _BLOCK, allocation)  # (replacing one on another GPU frees it there)


def _resized(storage: Any) -> None:
    """A storage on a simulated GPU whose size changed in place gets a block of its new size
    (none for 0 bytes) and gives its old one back, as a CUDA storage's resize allocates new
    memory, copies, and frees the old (`resize_bytes_cuda`): FSDP frees and re-allocates its
    unsharded parameters with `untyped_storage().resize_(0)` / `resize_(n)`. Compared with
    what its block was requested for, so a resize seen twice (torch hands `Tensor.resize_`
    back to the rank layer's mode, which calls it again) re-allocates once."""
    index = getattr(storage, _ATTR, None)
    if index is None:
        return
    held = getattr(storage, _BLOCK, None)
    after = storage.nbytes()
    if after == (0 if held is None else held.block.requested):
        return
    allocator = gpu_allocator.device(index)
    setattr(storage, _BLOCK, _Allocation(allocator, allocator.malloc(after)) if after else None)


def _install_resizes() -> None:
    """`UntypedStorage.resize_` and `Tensor.resize_` (which grows a storage only) of a simulated
    GPU's memory re-allocate it (`_resized`)."""
    orig_storage, orig_tensor = torch.UntypedStorage.resize_, torch.Tensor.resize_

    @functools.wraps(orig_storage)
    def storage_resize_(self: Any, size: int) -> Any:
        out = orig_storage(self, size)
        _resized(self)
        return out

    @functools.wraps(orig_tensor)
    def tensor_resize_(self: torch.Tensor, *sizes: Any, **kwargs: Any) -> Any:
        out = orig_tensor(self, *sizes, **kwargs)
        if gpu_index(self) is not None:
            _resized(self.untyped_storage())
        return out

    torch.UntypedStorage.resize_ = storage_resize_  # type: ignore[method-assign]
    torch.Tensor.resize_ = tensor_resize_  # type: ignore[method-assign]


def mark(t: Any, index: int) -> Any:
    """Place `t`'s memory (and every alias of it) on simulated GPU `index`; returns `t`."""
    if type(t) in PLAIN:
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):
            return t
        _place(storage, index)
    return t


def mark_storage(storage: Any, index: int) -> Any:
    """A storage placed on a simulated GPU (`torch.load(map_location="cuda")`)."""
    untyped = getattr(storage, "_untyped_storage", storage)  # a TypedStorage wraps one
    if isinstance(untyped, torch.UntypedStorage):
        _place(untyped, index)
    return storage


def input_index(args: tuple) -> int | None:
    """The simulated GPU of an operation's inputs, read off its first tensor argument: the
    first positional one, the first of a list (`torch.cat`), or the second (`torch.einsum`'s
    equation first). A valid GPU program mixes no host tensor into a device operation but a
    0-dim one, so the first tensor decides unless it is a host scalar: then any later
    positional tensor on a GPU does. (Inlined: the mode runs it on every call.)"""
    first = args[0]
    kind = type(first)
    if kind is list or kind is tuple:
        if not first:
            return None
        first = first[0]
        kind = type(first)
    elif kind not in PLAIN and len(args) > 1:
        first = args[1]
        kind = type(first)
    if kind not in PLAIN:
        return None
    try:
        index = getattr(first.untyped_storage(), _ATTR, None)
    except (RuntimeError, NotImplementedError):
        return None
    if index is None and first.dim() == 0:  # a host scalar may lead (`scale * grad`): the device is another's
        return next((i for a in args[1:] if (i := gpu_index(a)) is not None), None)
    return index


def mark_outputs(out: Any, index: int) -> None:
    """An operation's tensor results (one, or a tuple/list of them: `max(dim=...)`, `split`)
    are on GPU `index` (views of its inputs are already)."""
    if type(out) in PLAIN:
        mark(out, index)
    elif isinstance(out, (tuple, list)):
        for t in out:
            mark(t, index)


def numpy_refused(t: torch.Tensor, force: bool) -> TypeError | None:
    """torch's own error for `.numpy()` of a GPU tensor (torch/csrc/utils/tensor_numpy.cpp)."""
    index = None if force else gpu_index(t)
    if index is None:
        return None
    return TypeError(f"can't convert cuda:{index} device type tensor to numpy. Use Tensor.cpu() to copy the "
                     "tensor to host memory first.")


def host_numpy(t: torch.Tensor) -> Any:
    """`t`'s memory as a NumPy array, whichever device it stands for: the simulated process
    group reads and writes a GPU tensor's memory as NCCL does, where a script's `.numpy()`
    of it raises (the rank layer's `Tensor.numpy`)."""
    with torch._C.DisableTorchFunction():
        return torch._C.TensorBase.numpy(t)


def location_tag(storage: Any) -> str | None:
    """`torch.serialization`'s location of a storage on a simulated GPU: `cuda:N`, as torch
    tags a CUDA storage (`_backend_tag`), so that what is pickled off a GPU tensor comes back
    on its GPU. Every pickle of a tensor goes through it: `torch.save`, and plain `pickle`
    (a tensor reduces to `_rebuild_tensor_v2` of its storage, and a storage's `__reduce__` is
    a legacy `torch.save`: torch/storage.py), so `dist.all_gather_object` and
    `broadcast_object_list` too (`_object_to_tensor`/`_tensor_to_object` pickle and unpickle
    without `map_location`: a GPU tensor comes back on the device it was saved from, which the
    cuda deserializer restores through `torch.storage._to`, remapped by the rank layer).
    A file written here is a CUDA checkpoint for torch outside simdist too, readable on a
    machine without a GPU only with `map_location`, as a real one is."""
    untyped = getattr(storage, "_untyped_storage", storage)  # a TypedStorage wraps one
    index = getattr(untyped, _ATTR, None) if isinstance(untyped, torch.UntypedStorage) else None
    return None if index is None else f"cuda:{index}"


def rebuild_on_gpu(index: int, rebuild: Any, args: tuple) -> Any:
    """The receiving side of a GPU tensor sent through a `multiprocessing` queue or pipe:
    torch's own rebuild (host shared memory), placed on the sender's GPU, as CUDA IPC gives
    the receiver a tensor on the same device. CUDA is initialised first, as torch's
    `rebuild_cuda_tensor` calls `torch.cuda._lazy_init()` for a storage it has not received
    before (torch/multiprocessing/reductions.py): a forked child raises "Cannot re-initialize
    CUDA in forked subprocess" there (`cuda_init.lazy_init`). The memory is the sender's
    (`cudaIpcOpenMemHandle` maps the sender's block): the receiver's allocator is not asked for
    it, so its `memory_allocated` does not count it, as a receiver's does not."""
    cuda_init.lazy_init()
    t = rebuild(*args)
    if type(t) in PLAIN:
        setattr(t.untyped_storage(), _ATTR, index)
    return t


def _install_sharing() -> None:
    """`multiprocessing` pickles a tensor with torch's `reduce_tensor` (ForkingPickler's
    reducer for `torch.Tensor` and `Parameter`, torch/multiprocessing/reductions.py), which
    shares a host tensor's memory and rebuilds host memory on the other side: a GPU tensor's
    rebuild is wrapped in `rebuild_on_gpu`."""
    from multiprocessing.reduction import ForkingPickler

    import torch.multiprocessing.reductions as reductions

    orig = reductions.reduce_tensor

    @functools.wraps(orig)
    def reduce_tensor(t: torch.Tensor) -> tuple:
        rebuild, args = orig(t)
        index = gpu_index(t)
        return (rebuild, args) if index is None else (rebuild_on_gpu, (index, rebuild, args))

    for cls in PLAIN:
        ForkingPickler.register(cls, reduce_tensor)


def install() -> None:
    """The rank layer's view of simulated GPU memory in printing (`install_repr`), pickling
    (`location_tag`, asked before torch's own "cpu" tagger, priority 10), `multiprocessing`
    (`_install_sharing`) and in-place resizes (`_install_resizes`). Once per process
    (`devices.install`)."""
    install_repr()
    import torch.serialization

    torch.serialization.register_package(9, location_tag, lambda storage, location: None)
    _install_sharing()
    _install_resizes()


_PRINTING = threading.local()


def install_repr() -> None:
    """`print(t)` of a tensor on a simulated GPU shows `device='cuda:N'` where torch puts it,
    as a GPU run prints it (torch/_tensor_str.py `_str_intern`: the device suffix is the
    first, printed whenever the device is not the default device type, the CPU)."""
    import torch._tensor_str as ts

    orig_intern, orig_suffixes = ts._str_intern, ts._add_suffixes

    @functools.wraps(orig_intern)
    def _str_intern(inp: Any, *, tensor_contents: Any = None) -> str:
        index = gpu_index(inp)
        before = getattr(_PRINTING, "device", None)
        _PRINTING.device = None if index is None else f"device='cuda:{index}'"
        try:
            return orig_intern(inp, tensor_contents=tensor_contents)
        finally:
            _PRINTING.device = before

    @functools.wraps(orig_suffixes)
    def _add_suffixes(tensor_str: str, suffixes: list, indent: int, force_newline: bool) -> str:
        device = getattr(_PRINTING, "device", None)
        if device is not None:
            _PRINTING.device = None  # this tensor's own suffixes only
            suffixes = [device, *suffixes]
        return orig_suffixes(tensor_str, suffixes, indent, force_newline)

    ts._str_intern = _str_intern
    ts._add_suffixes = _add_suffixes
