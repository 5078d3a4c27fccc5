"""Hypothesis strategies that draw concrete scenarios from a template.

Every free choice of the template becomes one hypothesis draw, so hypothesis's shrinker
works on the template's own dimensions: ranges shrink toward their low end (fewer ranks,
fewer inputs), choices toward their first entry, optional steps toward absent.
"""

from __future__ import annotations

from typing import Any

from hypothesis import assume
from hypothesis import strategies as st
from pydantic import ValidationError

from simdist.errors import ScenarioError
from simdist.fuzz.counterexample import canonical
from simdist.fuzz.template import Template
from simdist.scenario import Inputs, Scenario, parse_scenario
from simdist.userfiles import check_data


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


class Validator:
    """`parse_scenario(d)` for the dicts of one template, the schema run once per distinct
    everything-but-the-inputs (most templates vary the input counts only).

    A dict whose other keys were validated before is that scenario with its inputs replaced
    by the validated ``d["inputs"]``, then cross-checked (`Scenario._cross_check`, the one
    validator that looks across fields, and the only one that reads the inputs) and its data
    checked (`check_data`: depth, sizes, scalars): every field of ``parse_scenario(d)`` is the
    validated value of ``d``'s own key, so that is ``parse_scenario(d)``. Anything refused on
    that path is parsed in full, which raises the problems in the usual words
    (tests/test_fuzz_verdicts.py compares the two on every bundled template)."""

    KEEP = 256  # distinct everything-but-the-inputs kept (a template drawing other fields too must not grow it without bound)

    def __init__(self, source: str):
        self.source = source
        self.valid: dict[str, Scenario] = {}  # canonical dict without "inputs" -> a scenario of it

    def __call__(self, d: dict[str, Any]) -> Scenario:
        key = canonical({k: v for k, v in d.items() if k != "inputs"})
        base = self.valid.get(key)
        if base is not None and isinstance(d.get("inputs"), dict):
            try:
                check_data(d, self.source)
                s = base.model_copy(update={"inputs": Inputs.model_validate(d["inputs"])})
                return s._cross_check()
            except (ScenarioError, ValidationError, ValueError):
                pass  # parsed in full below: its error names the field
        s = parse_scenario(d, source=self.source)
        if len(self.valid) < self.KEEP:
            self.valid.setdefault(key, s)
        return s


def template_scenarios(template: Template) -> st.SearchStrategy[tuple[dict[str, Any], Scenario]]:
    """Valid (dict, Scenario) pairs drawn from `template`; instances the schema rejects are
    discarded. Public (`simdist.template_scenarios`): use it in your own ``@given`` tests to
    check a property of your loop over a template's schedules (docs/fuzzing.md)."""

    made: dict[tuple[Any, ...], st.SearchStrategy[Any]] = {}
    validate = Validator(template.source)

    @st.composite
    def draw_valid(draw: Any) -> tuple[dict[str, Any], Scenario]:
        d = template.instantiate(DrawChooser(draw, made))
        try:
            s = validate(d)
        except ScenarioError:
            assume(False)
            raise  # unreachable
        return d, s

    return draw_valid()
