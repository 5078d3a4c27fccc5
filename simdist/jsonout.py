"""JSON that simdist writes (reports, verdicts, fuzz summaries): valid JSON, streamed.

* **Valid.** Python's `json` writes ``Infinity`` and ``NaN``, which are not JSON; a sum of
  large float32 values overflows to inf in the simulator exactly as in torch, so reports
  can hold them. `finite` turns each non-finite float into the string ``"inf"``,
  ``"-inf"`` or ``"nan"`` (docs/report.md), which `float()` reads back.
* **Streamed.** A 100,000-iteration run records hundreds of thousands of trace entries.
  Building the whole JSON document as dicts and then as one string took ten times the
  memory of the run itself; `write_json` writes chunk by chunk, and a `Lazy` list makes
  each of its items only when the encoder reaches it, so writing needs memory for one item.
  (`json.JSONEncoder.iterencode` without `_one_shot` runs the pure-Python encoder, which
  asks a list only for its truth value and its items; the text is the same as `json.dumps`.)
"""

from __future__ import annotations

import json
import math
from collections.abc import Callable, Iterator
from typing import IO, Any


def finite(x: Any) -> Any:
    """`x` with every non-finite float (in lists, tuples and dict values) as a string."""
    if isinstance(x, float):
        return x if math.isfinite(x) else repr(x)  # 'inf', '-inf', 'nan'
    if isinstance(x, dict):
        return {k: finite(v) for k, v in x.items()}
    if isinstance(x, (list, tuple)) and not isinstance(x, Lazy):
        return [finite(v) for v in x]
    return x


class Lazy(list):
    """A list of `n` items that exist only while the JSON encoder writes them: `make(i)` is
    called for item i when it is reached (see the module docstring)."""

    def __init__(self, n: int, make: Callable[[int], Any]):
        super().__init__()
        self._n = n
        self._make = make

    def __len__(self) -> int:
        return self._n

    def __bool__(self) -> bool:
        return self._n > 0

    def __iter__(self) -> Iterator[Any]:
        return (self._make(i) for i in range(self._n))


def _encoder(indent: int | None, default: Callable[[Any], Any] | None) -> json.JSONEncoder:
    return json.JSONEncoder(indent=indent, default=default, allow_nan=False)


def write_json(obj: Any, fp: IO[str], indent: int | None = 2, default: Callable[[Any], Any] | None = None) -> None:
    """Write `obj` (made `finite` by the caller; `Lazy` lists allowed) to `fp` in pieces of
    about 64 KiB (the encoder's chunks are a few characters each; one write per chunk is slow)."""
    buf: list[str] = []
    size = 0
    for chunk in _encoder(indent, default).iterencode(obj):
        buf.append(chunk)
        size += len(chunk)
        if size >= 1 << 16:
            fp.write("".join(buf))
            buf.clear()
            size = 0
    fp.write("".join(buf))


def dumps(obj: Any, indent: int | None = 2, default: Callable[[Any], Any] | None = None) -> str:
    """`obj` as one string of valid JSON; non-finite floats are made strings first."""
    return "".join(_encoder(indent, default).iterencode(finite(obj)))
