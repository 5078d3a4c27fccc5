"""Simulated tensor payloads and the value semantics of collectives.

A payload carries size and dtype always, and values only where they are cheap and useful:
explicit elements for small tensors (<= `MAX_EXPLICIT` elements), a single `fill` value
when every element is equal (zeros, ones), or `segments`: runs of equal values (a DDP
gradient bucket is one run per parameter). Fills and segments stay exact for any size
under every elementwise reduction. Anything else carries
no values (`None`), and results derived from it are unknown.

An `exact` payload keeps its explicit elements at any size: the script backend carries
the real tensors of a user's program, whose results must be what real ranks compute.
Results derived only from exact payloads are exact too; scenario payloads never are.

Values matter for control flow, not just for reports: Join's exit loop stops when its
count all-reduce returns 0, DDP's join hook skips the bucket shadows when the sync flag
sums to 0. Mismatched collectives that the backend pairs anyway therefore mix values
exactly as Gloo would, and the simulated control flow follows.
"""

from __future__ import annotations

import functools
import math
import struct
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from simdist.collectives.gloo import ring_blocks, ring_chain
from simdist.vocab import DTYPE_BYTES, OBSERVED_MAX_NUMEL

MAX_EXPLICIT = OBSERVED_MAX_NUMEL

NP_DTYPES: dict[str, Any] = {
    "float32": np.float32,
    "float64": np.float64,
    "float16": np.float16,
    "bfloat16": np.float32,  # numpy has no bfloat16; values are approximations
    "int64": np.int64,
    "int32": np.int32,
    "int16": np.int16,
    "int8": np.int8,
    "uint8": np.uint8,
    "bool": np.bool_,
}


@dataclass(frozen=True)
class Splits:
    """An all_to_all's element counts, in group-rank order: what this rank sends to each
    rank and receives from each (uneven for all_to_all_single with split sizes). `given`:
    the caller passed split sizes, so ProcessGroupGloo runs Gloo's alltoallv (else alltoall).
    The two share their slot prefix and, for even counts, their messages: it decides only
    which of their local checks fails (`engine.results.gloo_local_error`)."""

    send: tuple[int, ...]
    recv: tuple[int, ...]
    given: bool = False


@dataclass(slots=True)
class Payload:
    """A tensor as the simulator sees it."""

    numel: int
    dtype: str
    values: np.ndarray | None = None  # explicit elements (numel <= MAX_EXPLICIT)
    fill: float | None = None  # every element equals this
    segments: tuple[tuple[int, float], ...] | None = None  # (length, value) runs, when not uniform
    meta: Any = field(default=None, compare=False)  # opaque data a broadcast carries (e.g. bucket layout)
    exact: bool = field(default=False, compare=False)  # values kept at any size (script backend)

    @property
    def nbytes(self) -> int:
        return self.numel * DTYPE_BYTES[self.dtype]

    @classmethod
    def full(cls, numel: int, dtype: str, value: float, meta: Any = None) -> Payload:
        """A uniform tensor: stored as its fill only (arrays are made on demand).

        Payloads are never mutated, so the common ones (ones, zeros, ranks) are shared."""
        if meta is None:
            return _full_cached(numel, dtype, _key(value))
        return cls(numel, dtype, fill=_cast(value, dtype), meta=meta)

    @classmethod
    def runs(cls, runs: list[tuple[int, float]], dtype: str) -> Payload:
        """A tensor made of runs of equal values (e.g. a gradient bucket, one run per parameter).

        Shared like `full`'s: a DDP rank builds the same bucket every iteration."""
        return _runs_cached(tuple((n, _key(v)) for n, v in runs), dtype)

    def run_values(self) -> list[tuple[int, float]] | None:
        """The tensor as (length, value) runs of equal values, if its values are known."""
        if self.values is not None:
            out: list[tuple[int, float]] = []
            for v in self.values.tolist():
                if out and out[-1][1] == v:
                    out[-1] = (out[-1][0] + 1, v)
                else:
                    out.append((1, float(v)))
            return out
        if self.fill is not None:
            return [(self.numel, self.fill)]
        if self.segments is not None:
            return list(self.segments)
        return None

    @classmethod
    def unknown(cls, numel: int, dtype: str, meta: Any = None) -> Payload:
        if meta is None:
            return _unknown_cached(numel, dtype)
        return cls(numel, dtype, meta=meta)

    @classmethod
    def from_array(cls, arr: np.ndarray, dtype: str, meta: Any = None, exact: bool = False) -> Payload:
        arr = np.asarray(arr, dtype=NP_DTYPES[dtype])
        fill = float(arr[0]) if arr.size and np.all(arr == arr[0]) else None
        keep = exact or arr.size <= MAX_EXPLICIT
        return cls(int(arr.size), dtype, values=arr if keep else None, fill=fill, meta=meta, exact=exact)

    def array(self) -> np.ndarray | None:
        """Explicit elements if known (materialising a fill for small tensors)."""
        if self.values is not None:
            return self.values
        if self.fill is not None and self.numel <= MAX_EXPLICIT:
            return np.full(self.numel, self.fill, dtype=NP_DTYPES[self.dtype])
        if self.segments is not None and self.numel <= MAX_EXPLICIT:
            return np.concatenate([np.full(n, v, dtype=NP_DTYPES[self.dtype]) for n, v in self.segments])
        return None

    def item(self) -> float | None:
        """The value of a one-element tensor (or of any uniform one)."""
        if self.values is not None and self.values.size >= 1:
            return _py(self.values[0])
        if self.segments is not None:
            return self.segments[0][1]
        if self.fill is not None and self.dtype in _INT_DTYPES:
            return int(self.fill)
        return self.fill

    def observed(self) -> Any:
        """JSON-friendly value for reports: scalar for one element, list for small, None otherwise."""
        arr = self.array()
        if arr is None:
            return None
        if self.numel == 1:
            return _py(arr[0])
        return [_py(v) for v in arr]

    def reinterpret(self, dtype: str) -> Payload:
        """The same bytes read as another dtype (what a peer with a different dtype receives)."""
        if dtype == self.dtype:
            return self
        n = self.nbytes // DTYPE_BYTES[dtype]
        arr = self.array()
        if arr is None:
            return Payload.unknown(n, dtype)
        raw = np.ascontiguousarray(arr).tobytes()
        return Payload.from_array(np.frombuffer(raw[: n * DTYPE_BYTES[dtype]], dtype=NP_DTYPES[dtype]).copy(), dtype,
                                  exact=self.exact)


_D = struct.Struct("<d")


def _key(value: float) -> bytes:
    """A fill as the caches below key it: its bits as a float64. Keyed on the value itself,
    -0.0 == 0.0 made a -0.0 fill come back as a cached 0.0 (torch keeps the sign: 1/x,
    copysign), and nan != nan made every NaN fill a new entry. Exact: `_cast` depends on
    `float(value)` alone."""
    return _D.pack(value)


@functools.lru_cache(maxsize=4096)
def _full_cached(numel: int, dtype: str, key: bytes) -> Payload:
    return Payload(numel, dtype, fill=_cast(_D.unpack(key)[0], dtype))


@functools.lru_cache(maxsize=4096)
def _runs_cached(runs: tuple[tuple[int, bytes], ...], dtype: str) -> Payload:
    cast = [(n, _cast(_D.unpack(k)[0], dtype)) for n, k in runs if n > 0]
    numel = sum(n for n, _ in cast)
    if len({_key(v) for _, v in cast}) <= 1:  # one value, its sign and NaN included
        return Payload.full(numel, dtype, cast[0][1] if cast else 0.0)
    return Payload(numel, dtype, segments=tuple(cast))


@functools.lru_cache(maxsize=4096)
def _unknown_cached(numel: int, dtype: str) -> Payload:
    return Payload(numel, dtype)


def _cast(value: float, dtype: str) -> float:
    """A Python scalar as `dtype` would hold it (ints truncate, bool is 0/1, float16/32 round)."""
    if dtype in _INT_DTYPES:
        return float(int(value))
    if dtype == "bool":
        return float(bool(value))
    if dtype == "float32" and abs(value) < 3.4e38:
        return _F32.unpack(_F32.pack(value))[0]  # in range: the C float round trip, no numpy
    if dtype in ("float32", "float16"):
        with np.errstate(over="ignore"):  # overflow to inf is what torch does too, not news
            return float(NP_DTYPES[dtype](value))
    return float(value)


_F32 = struct.Struct("f")


_INT_DTYPES = {"int64", "int32", "int16", "int8", "uint8"}
_PY_REDUCERS = {
    "sum": lambda a, b: a + b,
    "product": lambda a, b: a * b,
    "min": min,
    "max": max,
    "band": lambda a, b: float(int(a) & int(b)),
    "bor": lambda a, b: float(int(a) | int(b)),
    "bxor": lambda a, b: float(int(a) ^ int(b)),
}


def _py(v: Any) -> float | int | bool:
    if isinstance(v, np.bool_):
        return bool(v)
    if isinstance(v, np.integer):
        return int(v)
    return float(v)


_REDUCERS = {
    "sum": np.add,
    "product": np.multiply,
    "min": np.minimum,
    "max": np.maximum,
    "band": np.bitwise_and,
    "bor": np.bitwise_or,
    "bxor": np.bitwise_xor,
}


# Gloo's max/min are std::max(own, received) / std::min(own, received) (gloo/math.h): on a
# tie (0.0 and -0.0) or a NaN they keep their first argument, where numpy's would not.
_GLOO_REDUCERS = {
    "max": lambda a, b: np.where(a < b, b, a),
    "min": lambda a, b: np.where(b < a, b, a),
}


def reduce_payloads(parts: list[Payload], op: str, dtype: str, numel: int, ring: str = "all_reduce") -> Payload:
    """Elementwise reduction of every rank's contribution, computed in `dtype`.

    `avg` is sum then divide by the number of contributions (integer division for
    integer dtypes, as torch does for integral AVG).
    """
    name = "sum" if op == "avg" else op
    if any(p.numel != numel for p in parts):
        # ranks disagree on the size (a mismatch the backend half-completes): the elementwise
        # result is not defined here; gloo_rules.mixed_result has the byte-level story
        return Payload.unknown(numel, dtype)
    if all(p.values is None and p.fill is not None for p in parts):
        # uniform inputs (the common case: zeros, ones, DDP buckets): pure Python, exact for any size
        py = _PY_REDUCERS[name]
        acc = parts[0].fill
        for p in parts[1:]:
            acc = py(acc, p.fill)
        if op == "avg":
            acc = float(int(acc) // len(parts)) if dtype in _INT_DTYPES else acc / len(parts)
        return Payload.full(numel, dtype, acc)  # type: ignore[arg-type]
    fn = _REDUCERS[name]
    npdt = NP_DTYPES[dtype]
    arrays = [p.array() for p in parts]
    exact = all(p.exact for p in parts)
    if all(a is not None for a in arrays) and (numel <= MAX_EXPLICIT or exact):
        acc = ring_reduce([np.asarray(a, dtype=npdt) for a in arrays], _GLOO_REDUCERS.get(name, fn), dtype, ring)
        if op == "avg":
            acc = (acc // len(parts)) if np.issubdtype(npdt, np.integer) else (acc / len(parts)).astype(npdt)
        return Payload.from_array(acc, dtype, exact=exact)
    runs = [p.run_values() for p in parts]
    if all(r is not None for r in runs) and len({tuple(n for n, _ in r) for r in runs}) == 1:  # type: ignore[union-attr]
        # same run layout on every rank (DDP buckets): reduce run by run
        py = _PY_REDUCERS[name]
        out = []
        for k, (n, v) in enumerate(runs[0]):  # type: ignore[index]
            acc = v
            for r in runs[1:]:
                acc = py(acc, r[k][1])  # type: ignore[index]
            if op == "avg":
                acc = float(int(acc) // len(parts)) if dtype in _INT_DTYPES else acc / len(parts)
            out.append((n, acc))
        return Payload.runs(out, dtype)
    fills = [p.fill for p in parts]
    if all(f is not None for f in fills):
        acc_s = np.asarray(fills[0], dtype=npdt)
        for f in fills[1:]:
            acc_s = np.asarray(fn(acc_s, np.asarray(f, dtype=npdt)), dtype=npdt)
        if op == "avg":
            acc_s = acc_s // len(parts) if np.issubdtype(npdt, np.integer) else acc_s / len(parts)
        return Payload.full(numel, dtype, float(acc_s))
    return Payload.unknown(numel, dtype)


def bf16_bits(arr: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16 (nearest, ties to even; NaN stays NaN), as bits."""
    arr = np.ascontiguousarray(arr, dtype=np.float32)
    bits = arr.view(np.uint32).astype(np.uint64)
    rounded = (bits + 0x7FFF + ((bits >> 16) & 1)) >> 16
    return np.where(np.isnan(arr), 0x7FC0, rounded).astype(np.uint16)


def bf16_round(arr: np.ndarray) -> np.ndarray:
    """float32 values rounded to bfloat16, kept as float32 (numpy has no bfloat16)."""
    return (bf16_bits(arr).astype(np.uint32) << 16).view(np.float32)


def ring_reduce(arrays: list[np.ndarray], fn: Any, dtype: str, op: str = "all_reduce",
                upto: int | None = None) -> np.ndarray:
    """Every rank's elements reduced in the order of Gloo's ring all_reduce or reduce
    (`simdist.collectives.gloo.ring_blocks`), so float results are the real ones bit for
    bit; each step is rounded to `dtype` as Gloo's typed reduction functions do.
    `upto=r`: what rank r's buffer holds after a ring reduce it is not the root of (each
    block reduced only along the ring from its first rank down to r)."""
    p, n = len(arrays), arrays[0].size
    rnd = bf16_round if dtype == "bfloat16" else None
    out = np.empty(n, dtype=arrays[0].dtype)
    # each rank reduces its own elements (first argument) with those it received (second)
    for j, (lo, hi) in enumerate(ring_blocks(n, p, DTYPE_BYTES[dtype], op)):
        if lo == hi:
            continue
        chain = ring_chain(j, p)
        if upto is not None:
            chain = chain[:chain.index(upto) + 1]
        acc = arrays[chain[0]][lo:hi]
        for r in chain[1:]:
            acc = fn(arrays[r][lo:hi], acc).astype(out.dtype)
            if rnd is not None:
                acc = rnd(acc)
        out[lo:hi] = acc
    return out


def reduce_partial(parts: list[Payload], op: str, dtype: str, index: int) -> Payload:
    """A non-root rank's tensor after Gloo's ring reduce: Gloo reduces in place in it, so it
    ends with partial sums (`ring_reduce(upto=...)`); its own input where values are unknown."""
    arrays = [p.array() if p.exact or p.numel <= MAX_EXPLICIT else None for p in parts]
    if any(a is None for a in arrays) or len({p.numel for p in parts}) != 1 or op == "avg":
        return parts[index]
    name = op
    npdt = NP_DTYPES[dtype]
    acc = ring_reduce([np.asarray(a, dtype=npdt) for a in arrays], _GLOO_REDUCERS.get(name, _REDUCERS[name]), dtype,
                      "reduce", upto=index)
    return Payload.from_array(acc, dtype, exact=all(p.exact for p in parts))


def concat_payloads(parts: list[Payload], dtype: str) -> Payload:
    """Concatenation in rank order (all_gather, gather)."""
    if all(p.fill is not None and p.values is None and p.segments is None and not p.exact for p in parts):
        # uniform inputs, e.g. DDP's parameter count gathered at construction: the same in every
        # run of a template, so kept (the result is never mutated, as no payload is). The sign
        # is part of the key: -0.0 == 0.0, but the gathered elements keep their own.
        return _concat_fills(tuple((p.numel, p.dtype, p.fill, math.copysign(1.0, p.fill)) for p in parts),  # type: ignore[arg-type]
                             dtype)
    return _concat(parts, dtype)


@functools.lru_cache(maxsize=1024)
def _concat_fills(fills: tuple[tuple[int, str, float, float], ...], dtype: str) -> Payload:
    return _concat([Payload(n, dt, fill=f) for n, dt, f, _ in fills], dtype)


def _concat(parts: list[Payload], dtype: str) -> Payload:
    numel = sum(p.numel for p in parts)
    arrays = [p.array() for p in parts]
    exact = bool(parts) and all(p.exact for p in parts)
    if (numel <= MAX_EXPLICIT or exact) and all(a is not None for a in arrays):
        return Payload.from_array(np.concatenate([np.asarray(a) for a in arrays]) if arrays else np.zeros(0), dtype,
                                  exact=exact)
    fills = {p.fill for p in parts}
    if len(fills) == 1 and None not in fills:
        return Payload.full(numel, dtype, next(iter(fills)))  # type: ignore[arg-type]
    return Payload.unknown(numel, dtype)


def alltoall_payload(parts: list[Payload], index: int, dtype: str) -> Payload:
    """What the rank at group index `index` receives in an all_to_all: from every rank, in
    rank order, the piece that rank addressed to it (`Splits` in each payload's meta;
    equal chunks where a payload has none)."""
    pieces = []
    for p in parts:
        splits = p.meta if isinstance(p.meta, Splits) else None
        if splits is None:
            pieces.append(chunk_payload(p, index, len(parts)))
            continue
        lo = sum(splits.send[:index])
        n = splits.send[index]
        arr = p.array() if p.exact or p.numel <= MAX_EXPLICIT else None
        if arr is not None:
            pieces.append(Payload.from_array(arr[lo:lo + n], dtype, exact=p.exact))
        elif p.fill is not None:
            pieces.append(Payload.full(n, dtype, p.fill))
        else:
            pieces.append(Payload.unknown(n, dtype))
    return concat_payloads(pieces, dtype)


def chunk_payload(p: Payload, index: int, chunks: int) -> Payload:
    """The index-th of `chunks` equal slices (reduce_scatter output, scatter, all_to_all)."""
    n = p.numel // chunks
    arr = p.array()
    if arr is not None:
        return Payload.from_array(arr[index * n : (index + 1) * n], p.dtype, exact=p.exact)
    if p.fill is not None:
        return Payload.full(n, p.dtype, p.fill)
    return Payload.unknown(n, p.dtype)
