"""Hypothesis strategies that draw concrete scenarios from a template.

Every free choice of the template becomes one hypothesis draw, so hypothesis's shrinker
works on the template's own dimensions: ranges shrink toward their low end (fewer ranks,
fewer inputs), choices toward their first entry, optional steps toward absent.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume
from hypothesis import strategies as st

from simdist.errors import ScenarioError
from simdist.fuzz.template import Template
from simdist.scenario import Scenario, parse_scenario


class DrawChooser:
    """A `Chooser` backed by hypothesis's `draw`.

    The strategies are made once per template search and kept in `made` (a template draws
    the same few ranges thousands of times; building ``st.integers(lo, hi)`` anew each time
    was a measurable part of every example). The draws themselves are unchanged."""

    def __init__(self, draw: Any, made: dict[tuple[Any, ...], st.SearchStrategy[Any]] | None = None):
        self.draw = draw
        self.made = {} if made is None else made

    def _strategy(self, key: tuple[Any, ...]) -> st.SearchStrategy[Any]:
        s = self.made.get(key)
        if s is None:
            kind, *args = key
            if kind == "int":
                s = st.integers(*args)
            elif kind == "float":
                s = st.floats(*args, allow_nan=False, allow_infinity=False)
            elif kind == "bool":
                s = st.booleans()
            else:
                items = list(args)
                s = st.lists(st.sampled_from(items), min_size=1, max_size=len(items), unique=True)
            self.made[key] = s
        return s

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(self._strategy(("int", lo, hi)))

    def floating(self, lo: float, hi: float) -> float:
        return self.draw(self._strategy(("float", lo, hi)))

    def index(self, n: int) -> int:
        return self.draw(self._strategy(("int", 0, n - 1)))

    def flag(self) -> bool:
        return self.draw(self._strategy(("bool",)))

    def subset(self, items: list[int]) -> list[int]:
        return self.draw(self._strategy(("subset", *items)))


def template_scenarios(template: Template) -> st.SearchStrategy[tuple[dict[str, Any], Scenario]]:
    """Valid (dict, Scenario) pairs drawn from `template`; instances the schema rejects are
    discarded. Public (`simdist.template_scenarios`): use it in your own ``@given`` tests to
    check a property of your loop over a template's schedules (docs/fuzzing.md)."""

    made: dict[tuple[Any, ...], st.SearchStrategy[Any]] = {}

    @st.composite
    def draw_valid(draw: Any) -> tuple[dict[str, Any], Scenario]:
        d = template.instantiate(DrawChooser(draw, made))
        try:
            s = parse_scenario(d, source=template.source)
        except ScenarioError:
            assume(False)
            raise  # unreachable
        return d, s

    return draw_valid()
