"""ProcessGroupGloo's own argument checks and memory reads (torch 2.13), for the simulated
group to raise and read what Gloo would (`rank.pg`): each measured against real Gloo by
tests/scripts/tensor_kinds.py. Messages are Gloo's words."""

from __future__ import annotations

from collections.abc import Sequence

import torch


def shape_text(dims: tuple[int, ...]) -> str:
    return "(" + ", ".join(str(d) for d in dims) + ")"


def gloo_memory(t: torch.Tensor) -> torch.Tensor | None:
    """What ProcessGroupGloo reads and writes for a tensor it takes by pointer (all_reduce,
    broadcast, reduce, scatter's tensors): `numel` elements from `data_ptr()`, whatever the
    strides (`getDataPointer`: "call sites must make sure that the input tensor is
    contiguous", and these do not). A non-contiguous tensor is thus read and written as the
    flat run of memory it starts (measured on torch 2.13): that run, as a tensor (None when
    it runs past the tensor's storage)."""
    if t.is_contiguous():
        return t
    if t.storage_offset() + t.numel() > t.untyped_storage().nbytes() // t.element_size():
        return None  # past its storage: memory that is not the tensor's (the caller says so)
    return t.as_strided((t.numel(),), (1,))


def require_contiguous(message: str, exc: type[Exception], *tensors: torch.Tensor) -> None:
    """Gloo's own contiguity checks, raised at the call before anything is issued."""
    if any(not t.is_contiguous() for t in tensors):
        raise exc(message)


def allgather_check(outputs: Sequence[torch.Tensor], inp: torch.Tensor, size: int) -> None:
    """ProcessGroupGloo::allgather's argument checks (torch 2.13), raised at the call: one
    output per rank, each of the input's shape. `all_gather_into_tensor` reaches them with
    its output cut into `size` chunks along dim 0, so an output of shape (world, n) for an
    input of shape (n,) is refused on Gloo (NCCL takes it)."""
    def invalid(msg: str) -> RuntimeError:
        return RuntimeError(f"ProcessGroupGloo::allgather: {msg}")

    if len(outputs) != size:
        raise invalid(f"invalid output tensor list at index 0 (expected length {size}, got {len(outputs)})")
    for k, t in enumerate(outputs):
        if tuple(t.shape) != tuple(inp.shape):
            raise invalid(f"invalid tensor size at index {k} (expected {shape_text(tuple(inp.shape))}, "
                          f"got {shape_text(tuple(t.shape))})")


# c10's TypeMeta names of dtypes (gcc's demangled C++ types), as its CHECK_EQ messages print them
_CXX_TYPE_NAMES = {torch.float32: "float", torch.float64: "double", torch.float16: "c10::Half",
                   torch.bfloat16: "c10::BFloat16", torch.int64: "long int", torch.int32: "int",
                   torch.int16: "short int", torch.int8: "signed char", torch.uint8: "unsigned char",
                   torch.bool: "bool"}


def reduce_scatter_check(output: torch.Tensor, inp: torch.Tensor, size: int) -> bool:
    """ProcessGroupGloo::reduce_scatter_tensor_coalesced's checks (torch 2.13: TORCH_CHECK_EQs,
    raised at the call; the real message carries a glog prefix with the time, "[rank0]:[F1123
    21:39:19... ProcessGroupGloo.cpp:1537] ", before this text): same dtype, the input's dim 0
    is the output's times the world size (not merely as many elements: (2, 2) from 8 is
    refused), and every further dim of the output equals the input's. That loop runs over the
    output's dims: an output with more dims than the input makes Gloo read past the input's
    shape (garbage, measured): False then, for the caller to name as not modelled. An output
    with fewer dims passes here and fails at wait(), on the copy out (`reduce_scatter_copy`)."""
    if output.dtype != inp.dtype:
        a, b = (_CXX_TYPE_NAMES.get(t.dtype, str(t.dtype)) for t in (output, inp))
        raise RuntimeError(f"Check failed: outputTensors[i].dtype() == inputTensors[i].dtype() ({a} vs. {b}). ")
    out0, in0 = (t.shape[0] if t.dim() else 1 for t in (output, inp))
    if out0 * size != in0:
        raise RuntimeError(f"Check failed: outputShape[0] * worldSize == inputShape[0] ({out0 * size} vs. {in0}). ")
    if output.dim() > max(inp.dim(), 1):
        return False
    for i in range(1, output.dim()):
        if output.shape[i] != inp.shape[i]:
            raise RuntimeError(f"Check failed: outputShape[i] == inputShape[i] ({output.shape[i]} vs. {inp.shape[i]}). ")
    return True


def reduce_scatter_copy(output: torch.Tensor, reduced: torch.Tensor, size: int, rank: int) -> None:
    """What ProcessGroupGloo's reduce_scatter_tensor work does in wait() (torch 2.13, a
    LambdaWork): `output.copy_(buffer.chunk(worldSize)[rank])`, broadcasting as copy_ does
    (an output (2,) of an input (4, 3) fails there with copy_'s own message). Until wait()
    the output is untouched, however long ago the all_reduce finished."""
    output.data.copy_(reduced.chunk(size)[rank])


def sizes_check(op: str, tensors: Sequence[torch.Tensor], like: torch.Tensor) -> None:
    """ProcessGroupGloo's gather and scatter checks on the root's list (torch 2.13): each
    tensor has the shape of the rank's own one (`assertTypeAndSizesMatch`)."""
    for k, t in enumerate(tensors):
        if tuple(t.shape) != tuple(like.shape):
            raise RuntimeError(f"ProcessGroupGloo::{op}: invalid tensor size at index {k} "
                               f"(expected {shape_text(tuple(like.shape))}, got {shape_text(tuple(t.shape))})")


def p2p_issued(tensors: Sequence[torch.Tensor], me: int, peer: int | None) -> bool:
    """Whether a send or recv passes Gloo's argument checks (`require_contiguous`,
    `peer_check`), so that it is an operation even if it fails as it posts."""
    return all(t.is_contiguous() for t in tensors) and peer != me


def peer_check(me: int, peer: int | None) -> None:
    """A send to or receive from the rank itself, which Gloo refuses at the call (torch 2.13,
    measured: `isend`, `irecv`, `recv` and `batch_isend_irecv`; torch's blocking `send` says
    so in Python first): a rank's pair with itself is never connected. Gloo's message names
    the rank's address after these words. `peer` None: a receive from any source."""
    if peer == me:
        raise RuntimeError("[enforce fail at third_party/gloo/gloo/transport/tcp/pair.cc:801] state_ >= CONNECTED. "
                           "1 vs 4. Pair is not connected (a rank's pair with itself)")
