"""DDP's bucket assignment: a pure port of c10d's `compute_bucket_assignment_by_size`.

DDP (initial buckets and `rebuild_buckets`) and `_broadcast_coalesced` both group tensors
with this routine, so bucket counts and sizes, and therefore the all-reduces and
broadcasts a run issues, follow from it.
"""

from __future__ import annotations

import functools
import sys

from simdist.vocab import DTYPE_BYTES

MB = 1024 * 1024
DEFAULT_BUCKET_CAP_MB = 25
DEFAULT_FIRST_BUCKET_BYTES = 1024 * 1024  # dist._DEFAULT_FIRST_BUCKET_BYTES
BROADCAST_BUCKET_SIZE = 250 * MB  # DDP.broadcast_bucket_size
MAXSIZE = sys.maxsize


def compute_bucket_assignment_by_size(
    numels: list[int],
    dtypes: list[str],
    size_limits: list[int],
    tensor_indices: list[int] | None = None,
) -> list[list[int]]:
    """Group tensors into buckets of at most (about) `size_limits` bytes, per dtype.

    Tensors are visited in the given order; a bucket is closed as soon as its size reaches
    the current limit (so it includes the tensor that crosses it), and each dtype moves to
    the next limit in `size_limits` after closing a bucket (the last limit repeats). When
    `tensor_indices` is given (the rebuild case: gradient-ready order) the bucket list keeps
    closing order; otherwise buckets are sorted by their smallest tensor index.
    Returns buckets as lists of tensor indices (fresh lists: the caller may keep and change them).

    Memoised (`_assign`): every rank of every run of a model asks the same questions (its
    initial buckets, `_broadcast_coalesced`'s, the rebuild's), and a fuzzer asks them for
    thousands of schedules of one template.
    """
    key = tuple(tensor_indices) if tensor_indices is not None else None
    return [list(b) for b in _assign(tuple(numels), tuple(dtypes), tuple(size_limits), key)]


@functools.lru_cache(maxsize=4096)
def _assign(numels: tuple[int, ...], dtypes: tuple[str, ...], size_limits: tuple[int, ...],
            tensor_indices: tuple[int, ...] | None) -> tuple[tuple[int, ...], ...]:
    result: list[list[int]] = []
    open_buckets: dict[str, tuple[list[int], int]] = {}  # dtype -> (indices, bytes); insertion-ordered
    limit_pos: dict[str, int] = {}
    for i, (n, dt) in enumerate(zip(numels, dtypes, strict=True)):
        index = tensor_indices[i] if tensor_indices is not None else i
        idx, size = open_buckets.get(dt, ([], 0))
        idx.append(index)
        size += n * DTYPE_BYTES[dt]
        pos = limit_pos.setdefault(dt, 0)
        if size >= size_limits[pos]:
            result.append(idx)
            open_buckets.pop(dt, None)
            if pos + 1 < len(size_limits):
                limit_pos[dt] = pos + 1
        else:
            open_buckets[dt] = (idx, size)
    for idx, _ in open_buckets.values():
        if idx:
            result.append(idx)
    if tensor_indices is None:
        result.sort(key=min)
    return tuple(tuple(b) for b in result)
