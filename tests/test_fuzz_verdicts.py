"""The fuzz checker's verdict cache (`Checker.verdicts`, keyed by `compress.verdict_key`) is a
true equivalence: a schedule judged from a compressed run simulated for another schedule gets
exactly the outcome it gets when simulated afresh, compressed or in full.

Every bundled template, with its input counts widened so that compression applies, is
instantiated at random (a fixed seed), and each schedule is judged with two siblings whose
gap ending at one of its input counts is longer by a multiple of the loop's period (so some
share its compressed run, some do not: whether they do is the key's business). For each
schedule the cached compressed verdict (pass, or "simulate in full") must be the one its own
compressed run gives, and three judges must agree on (failed, failure class, signature, summary): one
`Checker` shared by all of the template's schedules (cache hits), a fresh `Checker` (the
compressed run simulated for this schedule alone) and a `Checker(compress=False)` (the full
schedule simulated). The test also asserts that the cache was hit, so it cannot pass vacuously.
"""

from __future__ import annotations

import copy
import random
from pathlib import Path

import pytest
import tomllib

from simdist.errors import ScenarioError
from simdist.fuzz.checker import Checker
from simdist.fuzz.compress import apply, passes_compressed, plan, verdict_key
from simdist.fuzz.strategies import Validator
from simdist.fuzz.template import Template, parse_template
from simdist.scenario import parse_scenario
from tests.conftest import ROOT

TEMPLATES = sorted((ROOT / "scenarios" / "templates").glob("*.toml"))
SCHEDULES = 8  # per template, each with two siblings
MAX_COUNT = 24  # widened input counts: long enough steady gaps to remove


class RandomChooser:
    """A template `Chooser` drawing from Python's `random` (seeded)."""

    def __init__(self, rng: random.Random):
        self.rng = rng

    def integer(self, lo: int, hi: int) -> int:
        return self.rng.randint(lo, hi)

    def floating(self, lo: float, hi: float) -> float:
        return self.rng.uniform(lo, hi)

    def index(self, n: int) -> int:
        return self.rng.randrange(n)

    def flag(self) -> bool:
        return self.rng.random() < 0.5

    def subset(self, items: list[int]) -> list[int]:
        return sorted(self.rng.sample(items, self.rng.randint(1, len(items))))


def widened(path: Path) -> Template:
    data = tomllib.loads(path.read_text())
    data = copy.deepcopy(data)
    data["inputs"] = {"counts": {"each": {"range": [0, MAX_COUNT]}}}
    return parse_template(data, source=str(path), name=path.stem)


def outcome(checker: Checker, d: dict) -> tuple:
    o = checker.check(d)
    assert o is not None
    return o.failed, o.key, o.signature, o.summary


def siblings(d: dict, rng: random.Random) -> list[dict]:
    """`d` with the gap that ends at one of its (non-zero) input counts stretched by 1 and 2 periods."""
    counts = d["inputs"]["counts"]
    ends = sorted({c for c in counts if c > 0})
    if not ends:
        return []
    period = plan(parse_scenario(d)).period
    v = rng.choice(ends)
    out = []
    for k in (1, 2):
        n = copy.deepcopy(d)
        n["inputs"]["counts"] = [c + k * period if c >= v else c for c in counts]
        out.append(n)
    return out


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_cached_verdicts_equal_fresh_ones(path: Path) -> None:
    t = widened(path)
    rng = random.Random(f"verdicts/{path.stem}")
    shared = Checker(t)
    runs: dict[tuple, str] = {}  # verdict_key -> the compressed scenario it stands for
    judged = 0
    for _ in range(SCHEDULES * 3):
        if judged == SCHEDULES:
            break
        d = t.instantiate(RandomChooser(rng))
        try:
            parse_scenario(d, source=t.source)
        except ScenarioError:
            continue  # the schema rejects this instance (the fuzzer discards it too)
        judged += 1
        for x in [d, *siblings(d, rng)]:
            cached = outcome(shared, x)
            s = parse_scenario(x)
            p = plan(s)
            if p.compressed:  # the cached compressed verdict is this schedule's own
                vk = verdict_key(x, p)
                assert shared.verdicts[vk] == passes_compressed(s, p, invariants=t.invariants), x
                # one key, one compressed run: the key determines the whole compressed scenario
                assert runs.setdefault(vk, apply(s, p).model_dump_json()) == apply(s, p).model_dump_json(), x
            assert cached == outcome(Checker(t), x), x
            assert cached == outcome(Checker(t, compress=False), x), x
    assert judged == SCHEDULES
    # every bundled template's loop compresses, and its siblings meet in the cache
    assert shared.compressed > 0 and shared.reused > 0, (shared.compressed, shared.reused)


def _parsed(validate: Validator | None, d: dict) -> tuple:
    """("ok", the scenario's JSON) or ("error", the message), by `validate` or by `parse_scenario`."""
    try:
        s = validate(d) if validate is not None else parse_scenario(d, source="t")
    except ScenarioError as e:
        return "error", str(e)
    return "ok", s.model_dump_json()


@pytest.mark.parametrize("path", TEMPLATES, ids=lambda p: p.stem)
def test_validator_equals_parse_scenario(path: Path) -> None:
    """The strategies' `Validator` (the schema run once per everything-but-the-inputs) gives what
    `parse_scenario` gives, scenario or error, for a template's instances and for inputs the
    schema or the cross-checks refuse (too few counts, a negative or non-integer count, a
    `below` condition past the counts, `base` and `counts` together)."""
    t = widened(path)
    rng = random.Random(f"validator/{path.stem}")
    validate = Validator("t")
    fast = 0
    for _ in range(40):
        d = t.instantiate(RandomChooser(rng))
        counts = d["inputs"]["counts"]
        bad = [{"counts": counts[:-1]}, {"counts": [-1, *counts[1:]]}, {"counts": [1.5, *counts[1:]]},
               {"counts": counts, "base": 1}, {"base": 2, "offset": 1}, {}]
        for inputs in [d["inputs"], rng.choice(bad)]:
            x = {**d, "inputs": inputs}
            before = len(validate.valid)
            got = _parsed(validate, x)
            fast += got[0] == "ok" and len(validate.valid) == before
            assert got == _parsed(None, x), x
    assert fast > 0  # the memo was used, so the comparison is not vacuous
