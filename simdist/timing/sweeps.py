"""What a size sweep measures and how its times are reported (nccl-tests conventions).

Shared by the real backend's sweeps (`real_backend.bench`, which measures) and by the
cost model's explanations (`simdist.timing.explain`, which predicts), so a simulated
busbw and a measured one mean the same thing.
"""

from __future__ import annotations

from collections.abc import Callable

from simdist.vocab import dtype_bytes


def geometric_sizes(lo: int = 1024, hi: int = 64 << 20, factor: int = 2) -> list[int]:
    """lo, lo*factor, ... up to hi (nccl-tests' -b, -e, -f)."""
    out, s = [], lo
    while s <= hi:
        out.append(s)
        s *= factor
    return out


def midpoint_sizes(lo: int = 1024, hi: int = 64 << 20, align: int = 64) -> list[int]:
    """Sizes between the powers of two (2^(k+1/2), 2^(k+1/4)·... alternating), never a power of two.

    Used as held-out sizes: none of them is in a pow2 training sweep.
    """
    out = []
    s = lo
    k = 0
    while s * 2 <= hi:
        frac = (0.5, 0.25, 0.75)[k % 3]
        v = int(round(s * 2**frac / align)) * align
        if lo < v < hi and v not in out:
            out.append(v)
        s *= 2
        k += 1
    return out


# nccl-tests' busbw factors (doc/PERFORMANCE.md): the share of S that crosses each rank's
# link in an optimal ring, written out and as a function of p; other ops: 1.
_BUS_FACTORS: dict[str, tuple[str, Callable[[int], float]]] = {
    "all_reduce": ("2(p-1)/p", lambda p: 2.0 * (p - 1) / p),
    **{op: ("(p-1)/p", lambda p: (p - 1) / p) for op in ("all_gather", "reduce_scatter", "all_to_all")},
}
_NO_FACTOR: tuple[str, Callable[[int], float]] = ("1", lambda p: 1.0)


def bus_factor(op: str, p: int) -> float:
    """nccl-tests busbw factor (doc/PERFORMANCE.md): busbw = algbw * bus_factor."""
    return _BUS_FACTORS.get(op, _NO_FACTOR)[1](p)


def bus_factor_text(op: str) -> str:
    """`bus_factor` written in p, e.g. 2(p-1)/p, for explanations."""
    return _BUS_FACTORS.get(op, _NO_FACTOR)[0]


def dtype_count(nbytes: int, dtype: str = "float32") -> int:
    """Elements of `dtype` in `nbytes` (nccl-tests' count column)."""
    return nbytes // dtype_bytes(dtype)


def algbw_bytes(op: str, nbytes: int, p: int) -> int:
    """S in algbw = S / t: the per-rank buffer, or the total array for all_gather."""
    if op == "all_gather":
        return nbytes * p  # nbytes = per-rank contribution
    return nbytes
