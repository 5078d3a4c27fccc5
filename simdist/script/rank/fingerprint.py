"""c10d's CollectiveFingerPrint, as ProcessGroupWrapper (TORCH_DISTRIBUTED_DEBUG=DETAIL)
builds, serialises, compares and words it (torch 2.13, ProcessGroupWrapper.cpp).

A fingerprint is the op's type, the group's sequence number before it, and each checked
tensor's dtype, device type and shape. Serialised as one int64 tensor: op type, sequence
number, tensor count, the dtypes' c10 ScalarType codes, the device types' codes, then per
tensor its dimension count and sizes. The wrapper all-gathers that tensor's length first, then
the tensor, and raises on the first rank (in group-rank order) whose value differs from its
own; a differing length is deserialised from the one-element length tensor, so the peer reads
as op type = its length, sequence number 0, no tensors (measured: a barrier's peer read as
"REDUCE", a 1-D all_reduce's as "GATHER").

Pure data and text, so it is tested without processes (tests/test_detail_fingerprint.py); the
wording is the measured one, quirks included: c10 prints a list of strings space-separated
with no brackets, the diff puts no space before "vs", and a device type prints as the
TensorOptions it converts to.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch

# c10d's OpType (Work.hpp), in its order
OP_TYPES: tuple[str, ...] = (
    "BROADCAST", "ALLREDUCE", "ALLREDUCE_COALESCED", "REDUCE", "ALLGATHER", "_ALLGATHER_BASE",
    "ALLGATHER_COALESCED", "GATHER", "SCATTER", "REDUCE_SCATTER", "ALLTOALL_BASE", "ALLTOALL", "SEND", "RECV",
    "RECVANYSOURCE", "BARRIER", "_REDUCE_SCATTER_BASE", "COALESCED", "_ALLREDUCE_SPARSE",
    "REDUCE_SCATTER_TENSOR_COALESCED",
)
UNKNOWN_OP = 100  # OpType::UNKNOWN; any other value past the list fails torch's internal assert

# c10 ScalarType codes and names (torch/headeronly/core/ScalarType.h) of the dtypes a group takes
SCALAR_TYPES: dict[torch.dtype, tuple[int, str]] = {
    torch.uint8: (0, "Byte"), torch.int8: (1, "Char"), torch.int16: (2, "Short"), torch.int32: (3, "Int"),
    torch.int64: (4, "Long"), torch.float16: (5, "Half"), torch.float32: (6, "Float"), torch.float64: (7, "Double"),
    torch.complex64: (9, "ComplexFloat"), torch.complex128: (10, "ComplexDouble"), torch.bool: (11, "Bool"),
    torch.bfloat16: (15, "BFloat16"),
}
_SCALAR_NAMES = {code: name for code, name in SCALAR_TYPES.values()}
DEVICE_TYPES = {"cpu": 0, "cuda": 1}  # c10 DeviceType codes
_DEVICE_NAMES = {code: name for name, code in DEVICE_TYPES.items()}
# c10::toString of a DeviceType: it converts to TensorOptions (measured on cpu; cuda by the same rule)
_DEVICE_TEXT = ("TensorOptions(dtype=float (default), device={}, layout=Strided (default), requires_grad=false "
                "(default), pinned_memory=false (default), memory_format=(nullopt))")
MISMATCH = "Detected mismatch between collectives on ranks."


class UnknownOpType(RuntimeError):
    """opTypeToString's internal assert on a value that is no OpType (a peer's length read as one)."""


def op_name(code: int) -> str:
    if 0 <= code < len(OP_TYPES):
        return OP_TYPES[code]
    if code == UNKNOWN_OP:
        return "UNKNOWN"
    raise UnknownOpType(code)


def _scalar_name(code: int) -> str:
    return _SCALAR_NAMES.get(code, f"ScalarType({code})")


def _device_text(code: int) -> str:
    return _DEVICE_TEXT.format(_DEVICE_NAMES.get(code, str(code)))


@dataclass(frozen=True)
class FingerPrint:
    """One rank's fingerprint of the collective it is about to run."""

    op: int
    seq: int
    dtypes: tuple[int, ...] = ()
    devices: tuple[int, ...] = ()
    shapes: tuple[tuple[int, ...], ...] = ()

    @classmethod
    def of(cls, op: str, tensors: list[torch.Tensor], seq: int) -> FingerPrint:
        """Unknown dtypes raise KeyError: the caller names them (`pgwrapper`)."""
        return cls(OP_TYPES.index(op), seq, tuple(SCALAR_TYPES[t.dtype][0] for t in tensors),
                   tuple(DEVICE_TYPES.get(t.device.type, 0) for t in tensors),
                   tuple(tuple(int(s) for s in t.shape) for t in tensors))

    def serialize(self) -> list[int]:
        out = [self.op, self.seq, len(self.shapes), *self.dtypes, *self.devices]
        for shape in self.shapes:
            out += [len(shape), *shape]
        return out

    @classmethod
    def deserialize(cls, values: list[int]) -> FingerPrint:
        """As the wrapper reads a peer's gathered tensor: a one-element tensor (the length
        all_gather's) has an op type only."""
        if len(values) < 2:
            return cls(values[0], 0)
        n = values[2]
        dtypes, devices = tuple(values[3:3 + n]), tuple(values[3 + n:3 + 2 * n])
        shapes, i = [], 3 + 2 * n
        for _ in range(n):
            dims = values[i]
            shapes.append(tuple(values[i + 1:i + 1 + dims]))
            i += 1 + dims
        return cls(values[0], values[1], dtypes, devices, tuple(shapes))

    def _sizes(self) -> list[str]:
        return [str(s) for s in self.shapes[0]] if self.shapes else []

    def _dtype_names(self) -> list[str]:
        return [_scalar_name(d) for d in self.dtypes]

    def _device_names(self) -> list[str]:
        return [_device_text(d) for d in self.devices]

    def text(self) -> str:
        if not self.shapes:
            return f"CollectiveFingerPrint(SequenceNumber={self.seq}OpType={op_name(self.op)})"
        return (f"CollectiveFingerPrint(SequenceNumber={self.seq}, OpType={op_name(self.op)}, "
                f"TensorShape=[{', '.join(self._sizes())}], TensorDtypes={' '.join(self._dtype_names())}, "
                f"TensorDeviceTypes={' '.join(self._device_names())})")

    def diff(self, other: FingerPrint) -> str:
        """compute_collective_diff: what differs, this rank's value first ('' when nothing)."""
        parts = []
        if other.seq != self.seq:
            parts.append(f"\t Sequence number: {self.seq}vs {other.seq}")
        if op_name(other.op) != op_name(self.op):
            parts.append(f"  Op type: {op_name(self.op)}vs {op_name(other.op)}")
        for arg, mine, theirs in (("Tensor shapes", self._sizes(), other._sizes()),
                                  ("Tensor dtypes", self._dtype_names(), other._dtype_names()),
                                  ("Tensor devices", self._device_names(), other._device_names())):
            if mine != theirs:
                parts.append(f"  Tensor {arg}: {' '.join(mine)}vs {' '.join(theirs)}")
        return "Collectives differ in the following aspects: " + "".join(parts) if parts else ""


def mismatch_message(me: int, mine: FingerPrint, peer: int, theirs: FingerPrint) -> str:
    """The wrapper's error on rank `me` (group ranks) for the first peer whose value differs."""
    return (f"{MISMATCH} Rank {me} is running collective: {mine.text()}, but Rank {peer} is running "
            f"collective: {theirs.text()}.{mine.diff(theirs)}")
