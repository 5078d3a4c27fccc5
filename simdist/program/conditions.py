"""What a step's conditions and conditional values mean on one rank and iteration.

A condition (`simdist.schema.When`) is data: `every`/`offset`, `below`, `from_iteration`,
`ranks`, `flag`, and nested `not`/`any`. It is evaluated here and nowhere else, by the
interpreter, so the simulator and the real backend take the same branch by construction.
A `flag` reads the latest result the rank observed under that name (a step's `observe`),
which the driver that executes the actions records; `Latest` is how the interpreter asks.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from simdist.schema import ScalarValue, Value, ValueWhen, When

Latest = Callable[[str], Any]
"""The latest result this rank observed under a name (None before the first)."""


def no_results(name: str) -> None:
    """`Latest` for a program whose driver records nothing (every flag is false)."""
    return None


def holds(c: When, rank: int, i: int | None, latest: Latest) -> bool:
    """Whether condition `c` holds on `rank` at loop iteration `i` (None: after the loop,
    where iteration conditions never hold; the scenario rejects them there anyway)."""
    if c.ranks is not None and rank not in c.ranks:
        return False
    if c.every is not None or c.below is not None or c.from_iteration is not None:
        if i is None:
            return False
        if c.every is not None and i % c.every != (c.offset or 0):
            return False
        if c.below is not None and i >= c.below:
            return False
        if c.from_iteration is not None and i < c.from_iteration:
            return False
    if c.flag is not None and not nonzero(latest(c.flag)):
        return False
    if c.not_ is not None and holds(c.not_, rank, i, latest):
        return False
    return c.any_ is None or any(holds(x, rank, i, latest) for x in c.any_)


def always(c: When) -> bool:
    """Whether `c` sets no condition at all, so `holds` is true on every rank and iteration
    (most steps: the interpreter asks once per rank instead of once per step and iteration)."""
    return (c.ranks is None and c.every is None and c.below is None and c.from_iteration is None and c.flag is None
            and c.not_ is None and c.any_ is None)


def nonzero(result: Any) -> bool:
    """A result as a flag: a nonzero number, or a list with a nonzero element (None: false)."""
    if isinstance(result, list):
        return any(nonzero(x) for x in result)
    return isinstance(result, (int, float)) and result != 0


def fill_value(value: Value, rank: int, i: int | None, latest: Latest) -> float | int:
    """A step's `value` on this rank and iteration ("iteration" is -1 outside the loop)."""
    if isinstance(value, ValueWhen):
        return _scalar(value.then if holds(value.when, rank, i, latest) else value.else_, rank, i)
    return _scalar(value, rank, i)


def _scalar(value: ScalarValue, rank: int, i: int | None) -> float | int:
    if value == "rank":
        return rank
    if value == "iteration":
        return -1 if i is None else i
    return float(value)


def varies(value: Value) -> bool:
    """Whether a value can differ from one iteration to the next on the same rank."""
    if isinstance(value, ValueWhen):
        return True
    return value == "iteration"
