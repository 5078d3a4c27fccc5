"""Tensor bytes from a rank to the engine's `Payload` and back, values kept exactly.

numpy has no bfloat16: its values are widened to float32 exactly (a bfloat16 is the top
half of a float32) and rounded back to nearest-even on the way out, which is what torch
does around each bfloat16 operation.
"""

from __future__ import annotations

import numpy as np

from simdist.engine.values import NP_DTYPES, Payload, bf16_bits


def to_payload(raw: bytes | bytearray | None, dtype: str, numel: int) -> Payload:
    """What the engine carries for a rank's input: exact values, or only its size."""
    if raw is None:
        return Payload.unknown(numel, dtype)
    if dtype == "bfloat16":
        arr = (np.frombuffer(raw, dtype=np.uint16).astype(np.uint32) << 16).view(np.float32)
    else:
        arr = np.frombuffer(raw, dtype=NP_DTYPES[dtype])
    return Payload.from_array(arr, dtype, exact=True)


def _materialise(p: Payload) -> np.ndarray | None:
    if p.values is not None:
        return np.asarray(p.values)
    npdt = NP_DTYPES[p.dtype]
    if p.fill is not None:
        return np.full(p.numel, p.fill, dtype=npdt)
    if p.segments is not None:
        return np.concatenate([np.full(n, v, dtype=npdt) for n, v in p.segments])
    return None


def to_bytes(p: Payload) -> bytes | None:
    """The result tensor's bytes, or None when the engine does not know its values."""
    arr = _materialise(p)
    if arr is None:
        return None
    if p.dtype == "bfloat16":
        return bf16_bits(arr).tobytes()
    return np.ascontiguousarray(arr, dtype=NP_DTYPES[p.dtype]).tobytes()
