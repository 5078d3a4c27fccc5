"""Values that depend on a scenario's everything-but-the-inputs, worked out once per shape.

A fuzzer judges thousands of scenarios of one template that differ only in their inputs,
and each run worked out the same rank programs' set-up, loop bodies and operation budget
again. Scenarios are frozen pydantic models, and the fuzzer's scenarios share every field
object but the inputs (`fuzz.strategies.Validator` replaces only those, and so does
`fuzz.compress.apply`), so a memo keyed by the identities of those field objects finds them
without comparing or serialising anything: equal identities mean equal fields. Each entry
holds the field objects themselves, so no other object can take one of its ids while it is
kept; scenarios parsed separately (equal but not identical) simply miss.
"""

from __future__ import annotations

from collections.abc import Callable, Hashable
from typing import Any, TypeVar

from simdist.scenario import Scenario

T = TypeVar("T")


class ShapeMemo:
    """`make()`'s value for (`what`, the shape of `s`): `make` must read nothing of `s` but
    fields other than `inputs` (and `what`)."""

    def __init__(self, keep: int = 256):
        self._keep = keep  # entries kept (cleared when full: a template has a handful of shapes)
        self._values: dict[tuple[Any, ...], tuple[tuple[Any, ...], Any]] = {}
        # the last scenario asked about and its shape (asked once per rank of a run)
        self._last: tuple[Scenario | None, tuple[Any, ...], tuple[Any, ...]] = (None, (), ())

    def get(self, s: Scenario, what: Hashable, make: Callable[[], T]) -> T:
        last, fields, ids = self._last
        if s is not last:
            fields = tuple(v for k, v in s.__dict__.items() if k != "inputs")
            ids = (type(s), *map(id, fields))
            self._last = (s, fields, ids)
        hit = self._values.get((what, ids))
        if hit is not None:
            return hit[1]  # type: ignore[no-any-return]
        value = make()
        if len(self._values) >= self._keep:
            self._values.clear()
        self._values[(what, ids)] = (fields, value)
        return value
