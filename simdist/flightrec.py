"""The c10d Flight Recorder's entry format, read the same way by every real-side recorder.

`real_backend.record` turns a scenario worker's entries into traces; the script backend's
Gloo mode (`simdist.script`) does the same for a user's script. FR must be enabled before
`init_process_group` (`FR_ENV`); its entries carry the op (`profiling_name`, e.g.
`gloo:allreduce`), input sizes and dtypes, the per-group `collective_seq_id`, the group
and the Python frames of the call.
"""

from __future__ import annotations

import math

FR_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_SIZE = "20000"

FR_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}
# Ops without a tensor payload are recorded with numel 0 and this dtype.
NO_DTYPE = "none"


def fr_numel(sizes: list[list[int]]) -> int:
    """Element count of an entry's first input."""
    return math.prod(sizes[0]) if sizes else 0


def fr_op_name(profiling_name: str) -> str:
    """The simulator's op name of an entry (`gloo:allreduce` -> `all_reduce`)."""
    op = profiling_name.split(":", 1)[-1]
    return {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all"}.get(op, op)


def fr_dtype(dtypes: list[str]) -> str:
    """The simulator's dtype name of an entry's first input."""
    return FR_DTYPES.get(dtypes[0], dtypes[0].lower()) if dtypes else NO_DTYPE
