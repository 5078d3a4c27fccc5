"""Raw bytes as Gloo moves and reduces them, for values of mismatched collectives.

Gloo sends tensors as untyped bytes; the *receiver* reads them as its own dtype and
reduces them with its own reduce op. So a rank that all-reduces float32 next to a rank
that all-reduces int32 adds bit patterns it misreads. This module encodes Python numbers
to little-endian bytes, decodes them back, and reduces byte ranges element-wise, with
`UNDEF` marking bytes that come from Gloo's uninitialised scratch buffer.
"""

from __future__ import annotations

import math
import struct

from simdist.vocab import dtype_bytes

UNDEF = None  # an undefined byte (uninitialised gloo scratch memory)

_FMT = {"float32": "<f", "float64": "<d", "float16": "<e", "int64": "<q", "int32": "<i",
        "int16": "<h", "int8": "<b", "uint8": "<B", "bool": "<?",
        "float": "<f", "double": "<d", "half": "<e", "long": "<q", "int": "<i", "short": "<h"}


def real_dtype(dtype: str) -> str:
    """The dtype Gloo computes in: complex tensors are viewed as pairs of reals."""
    d = dtype.removeprefix("torch.")
    return {"complex64": "float32", "complex128": "float64"}.get(d, d)


def decode(b: bytes, dtype: str):
    if dtype == "bfloat16":
        return struct.unpack("<f", b"\x00\x00" + b)[0]
    if dtype == "bool":
        return b[0] != 0
    return struct.unpack(_FMT[dtype], b)[0]


def encode(v, dtype: str) -> bytes:
    if dtype == "bfloat16":
        return struct.pack("<f", float(v))[2:]  # truncation (round-to-nearest in torch)
    if dtype == "bool":
        return bytes([1 if v else 0])
    fmt = _FMT[dtype]
    if fmt[1] in "qihbB":
        bits = struct.calcsize(fmt) * 8
        v = int(v) & ((1 << bits) - 1)
        if fmt[1] != "B" and v >= 1 << (bits - 1):
            v -= 1 << bits
        return struct.pack(fmt, v)
    try:
        return struct.pack(fmt, float(v))
    except OverflowError:
        return struct.pack(fmt, math.copysign(math.inf, v))


def decode_all(buf: list, dtype: str) -> list:
    """Every whole element of `buf` (a list of byte values), None where a byte is UNDEF."""
    e = dtype_bytes(dtype)
    vals: list = []
    for k in range(0, len(buf) - len(buf) % e, e):
        chunk = buf[k: k + e]
        vals.append(None if any(x is UNDEF for x in chunk) else decode(bytes(chunk), dtype))
    return vals


def _isnan(x) -> bool:
    return isinstance(x, float) and x != x


def apply(op: str, a, b):
    """One element of Gloo's reduction `op` (upper case, as ReduceOp names it)."""
    if op in ("SUM", "AVG"):
        return a + b
    if op == "PRODUCT":
        return a * b
    if op == "MIN":
        return min(a, b) if not _isnan(a) else a
    if op == "MAX":
        return max(a, b) if not _isnan(a) else a
    if op == "BAND":
        return int(a) & int(b)
    if op == "BOR":
        return int(a) | int(b)
    if op == "BXOR":
        return int(a) ^ int(b)
    raise ValueError(f"unknown reduce op {op}")


def reduce_into(dst: list, dst_off: int, src: list, src_off: int, n: int, dtype: str, op: str) -> None:
    """Element-wise ``dst = op(dst, src)`` over n bytes, read as `dtype` (a real dtype)."""
    e = dtype_bytes(dtype)
    for k in range(0, n - n % e, e):
        a = dst[dst_off + k: dst_off + k + e]
        b = src[src_off + k: src_off + k + e]
        if any(x is UNDEF for x in a) or any(x is UNDEF for x in b):
            dst[dst_off + k: dst_off + k + e] = [UNDEF] * e
            continue
        va, vb = decode(bytes(a), dtype), decode(bytes(b), dtype)
        dst[dst_off + k: dst_off + k + e] = list(encode(apply(op, va, vb), dtype))


def average(v, w: int, dtype: str):
    """AVG's final local division by the group size, in `dtype`. An integer or bool
    tensor keeps the SUM: the in-place division raises there (`results.gloo_avg_error`)."""
    if dtype.startswith("int") or dtype in ("long", "int", "short", "uint8", "bool"):
        return v
    return decode(encode(v / w, dtype), dtype)
