"""The uneven-input fuzzer: scenario templates, hypothesis strategies, the runner and `simdist fuzz`.

A template is a scenario whose values may be `{ range = [lo, hi] }`, `{ choice = [...] }`,
`{ each = ... }` (one value per rank) or `{ subset = "world" }`, and whose steps may be
`optional = true`; see docs/fuzzing.md.
"""

from simdist.fuzz.runner import FuzzResult, fuzz_template
from simdist.fuzz.template import Template, load_template, parse_template

__all__ = ["FuzzResult", "Template", "fuzz_template", "load_template", "parse_template"]
