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
    """A `Chooser` backed by hypothesis's `draw`."""

    def __init__(self, draw: Any):
        self.draw = draw

    def integer(self, lo: int, hi: int) -> int:
        return self.draw(st.integers(lo, hi))

    def floating(self, lo: float, hi: float) -> float:
        return self.draw(st.floats(lo, hi, allow_nan=False, allow_infinity=False))

    def index(self, n: int) -> int:
        return self.draw(st.integers(0, n - 1))

    def flag(self) -> bool:
        return self.draw(st.booleans())

    def subset(self, items: list[int]) -> list[int]:
        return self.draw(st.lists(st.sampled_from(items), min_size=1, max_size=len(items), unique=True))


def template_scenarios(template: Template) -> st.SearchStrategy[tuple[dict[str, Any], Scenario]]:
    """Valid (dict, Scenario) pairs drawn from `template`; instances the schema rejects are
    discarded. Public (`simdist.template_scenarios`): use it in your own ``@given`` tests to
    check a property of your loop over a template's schedules (docs/fuzzing.md)."""

    @st.composite
    def draw_valid(draw: Any) -> tuple[dict[str, Any], Scenario]:
        d = template.instantiate(DrawChooser(draw))
        try:
            s = parse_scenario(d, source=template.source)
        except ScenarioError:
            assume(False)
            raise  # unreachable
        return d, s

    return draw_valid()
