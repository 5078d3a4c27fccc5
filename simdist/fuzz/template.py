"""Scenario templates: a scenario whose parts vary.

A template is TOML in the scenario schema (docs/scenarios.md) where

* any value may be a *marker table*:
  - ``{ range = [lo, hi] }``: an integer (or a float, when a bound is a float) in [lo, hi];
  - ``{ choice = [a, b, ...] }``: one of the values (any TOML values, tables included);
  - ``{ each = X }``: a list with one entry per rank, each drawn from ``X`` (a marker or a
    plain value), e.g. ``counts = { each = { range = [0, 6] } }``;
  - ``{ subset = "world" }`` or ``{ subset = [0, 2, 3] }``: a non-empty sorted subset of the
    ranks (of the world, or of the listed ranks that exist in this world size);
* a step of ``loop`` or ``after`` may carry ``optional = true``: present or absent;
* an optional ``[fuzz]`` table sets the template's defaults: ``budget`` (examples),
  ``invariants`` (check the loop's semantic invariants, default true), ``expect``
  (``"failure"`` for a deadlock-family template, ``"ok"`` for a correct loop: documentation
  and the tests' oracle; it does not change what counts as a failure).

`world_size` is drawn first, so ``each`` and ``subset`` know the number of ranks. Markers
are drawn in file order. Shrinking moves ranges toward their low end, choices toward their
first entry, optional steps toward absent: write templates so that "small" means "simple".

Errors are one line naming the field, raised as `simdist.errors.ScenarioError`.
"""

from __future__ import annotations

import hashlib
import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from simdist.errors import LimitError, ScenarioError
from simdist.limits import MAX_WORLD_SIZE
from simdist.program.budget import check_ops
from simdist.scenario import Scenario, parse_scenario, read_toml
from simdist.userfiles import check_data

MARKERS = ("range", "choice", "each", "subset")
FUZZ_KEYS = {"budget": int, "invariants": bool, "expect": str, "description": str}
MAX_BUDGET = 10_000_000  # examples per template: more is a typo, not a search


class Chooser(Protocol):
    """Where a template's free choices come from (hypothesis, or fixed low/high ends)."""

    def integer(self, lo: int, hi: int) -> int: ...

    def floating(self, lo: float, hi: float) -> float: ...

    def index(self, n: int) -> int: ...

    def flag(self) -> bool: ...

    def subset(self, items: list[int]) -> list[int]: ...


class Extreme:
    """Every choice at its low (``high=False``: ranges at lo, first choice, optional steps absent)
    or high end; used to validate a template before fuzzing it."""

    def __init__(self, high: bool):
        self.high = high

    def integer(self, lo: int, hi: int) -> int:
        return hi if self.high else lo

    def floating(self, lo: float, hi: float) -> float:
        return hi if self.high else lo

    def index(self, n: int) -> int:
        return n - 1 if self.high else 0

    def flag(self) -> bool:
        return self.high

    def subset(self, items: list[int]) -> list[int]:
        return list(items) if self.high else items[:1]


@dataclass
class Template:
    """A scenario with free choices (ranges, choices, per-rank values, optional steps) that the
    fuzzer draws from; `instantiate` makes one concrete scenario dict."""

    name: str
    source: str
    body: dict[str, Any]  # the scenario part, markers unresolved
    budget: int = 200
    invariants: bool = True
    expect: str | None = None
    description: str = ""
    digest: str = field(default="")

    def instantiate(self, chooser: Chooser) -> dict[str, Any]:
        """One concrete scenario dict (not yet validated)."""
        return instantiate(self.body, chooser)

    def scenario(self, chooser: Chooser) -> Scenario:
        return parse_scenario(self.instantiate(chooser), source=self.source)


def _is_marker(v: Any) -> bool:
    return isinstance(v, dict) and any(k in v for k in MARKERS)


def _err(source: str, loc: str, msg: str) -> ScenarioError:
    return ScenarioError(f"{source}: {loc or 'template'}: {msg}")


def _num(x: Any) -> bool:
    return isinstance(x, (int, float)) and not isinstance(x, bool)


def check_markers(v: Any, loc: str, source: str, in_each: bool = False) -> None:
    """Structural check of every marker in a template value (one-line, field-named errors).

    An ``each`` inside an ``each`` is refused: it would make world_size ** depth values."""
    if isinstance(v, list):
        for i, x in enumerate(v):
            check_markers(x, f"{loc}[{i}]", source, in_each)
        return
    if not isinstance(v, dict):
        return
    if not _is_marker(v):
        for k, x in v.items():
            check_markers(x, f"{loc}.{k}" if loc else k, source, in_each)
        return
    keys = [k for k in v if k in MARKERS]
    if len(keys) > 1:
        raise _err(source, loc, f"a marker table holds exactly one of {', '.join(MARKERS)}, got {', '.join(keys)}")
    key = keys[0]
    extra = [k for k in v if k != key]
    if extra:
        raise _err(source, f"{loc}.{extra[0]}", f"unknown key next to '{key}'")
    arg = v[key]
    here = f"{loc}.{key}"
    if key == "range":
        if not (isinstance(arg, list) and len(arg) == 2 and all(_num(x) for x in arg)):
            raise _err(source, here, "needs two numbers [lo, hi]")
        if arg[0] > arg[1]:
            raise _err(source, here, f"low end {arg[0]} is above high end {arg[1]}")
    elif key == "choice":
        if not isinstance(arg, list) or not arg:
            raise _err(source, here, "needs a non-empty list of values")
        for i, x in enumerate(arg):
            check_markers(x, f"{here}[{i}]", source, in_each)
    elif key == "each":
        if in_each:
            raise _err(source, here, "an 'each' inside an 'each' is not allowed (one value per rank is one level)")
        check_markers(arg, here, source, True)
    elif key == "subset":
        if not (arg == "world" or (isinstance(arg, list) and arg and all(isinstance(x, int) and x >= 0 for x in arg))):
            raise _err(source, here, "needs \"world\" or a non-empty list of ranks")


def resolve(v: Any, chooser: Chooser, world: int) -> Any:
    if isinstance(v, list):
        return [resolve(x, chooser, world) for x in v]
    if not isinstance(v, dict):
        return v
    if not _is_marker(v):
        return {k: resolve(x, chooser, world) for k, x in v.items()}
    if "range" in v:
        lo, hi = v["range"]
        if isinstance(lo, int) and isinstance(hi, int):
            return chooser.integer(lo, hi)
        return chooser.floating(float(lo), float(hi))
    if "choice" in v:
        opts = v["choice"]
        return resolve(opts[chooser.index(len(opts))], chooser, world)
    if "each" in v:
        return [resolve(v["each"], chooser, world) for _ in range(world)]
    items = list(range(world)) if v["subset"] == "world" else sorted({r for r in v["subset"] if r < world})
    if not items:
        return sorted(v["subset"])[:1]  # no listed rank exists in this world: invalid, rejected later
    return sorted(chooser.subset(items))


def _steps(steps: Any, chooser: Chooser, world: int) -> Any:
    if not isinstance(steps, list):
        return resolve(steps, chooser, world)
    out = []
    for st in steps:
        if isinstance(st, dict) and "optional" in st:
            keep = chooser.flag() if st["optional"] else True
            st = {k: x for k, x in st.items() if k != "optional"}
            if not keep:
                continue
        out.append(resolve(st, chooser, world))
    return out


def instantiate(body: dict[str, Any], chooser: Chooser) -> dict[str, Any]:
    world = resolve(body.get("world_size", 1), chooser, 1)
    # Per-rank markers make `ranks` values: only for a world the schema accepts (an invalid
    # one, e.g. 10**18, is rejected by the schema, not expanded).
    ranks = world if isinstance(world, int) and not isinstance(world, bool) and 1 <= world <= MAX_WORLD_SIZE else 1
    out: dict[str, Any] = {}
    for k, v in body.items():
        if k == "world_size":
            out[k] = world
        elif k in ("loop", "after"):
            out[k] = _steps(v, chooser, ranks)
        else:
            out[k] = resolve(v, chooser, ranks)
    return out


def parse_template(data: dict[str, Any], source: str = "<template>", name: str | None = None) -> Template:
    """Validate a template dict: markers well-formed, and its low and high instances valid scenarios."""
    if not isinstance(data, dict):
        raise _err(source, "", "a template is a table")
    check_data(data, source)
    body = {k: v for k, v in data.items() if k != "fuzz"}
    fz = data.get("fuzz", {})
    if not isinstance(fz, dict):
        raise _err(source, "fuzz", "must be a table")
    for k, v in fz.items():
        if k not in FUZZ_KEYS:
            raise _err(source, f"fuzz.{k}", "unknown key")
        if not isinstance(v, FUZZ_KEYS[k]) or (FUZZ_KEYS[k] is int and isinstance(v, bool)):
            raise _err(source, f"fuzz.{k}", f"must be a {FUZZ_KEYS[k].__name__}")
    if "budget" in fz and fz["budget"] < 1:
        raise _err(source, "fuzz.budget", "must be >= 1")
    if "budget" in fz and fz["budget"] > MAX_BUDGET:
        raise _err(source, "fuzz.budget", f"must be <= {MAX_BUDGET:,}")
    if fz.get("expect") not in (None, "failure", "ok"):
        raise _err(source, "fuzz.expect", "must be \"failure\" or \"ok\"")
    if "expect" in body:
        raise _err(source, "expect", "a template cannot carry [expect]: the fuzz property (no hang, no mismatch, "
                   "invariants hold) is the expectation")
    if "world_size" not in body:
        raise _err(source, "world_size", "missing (a number or a marker such as { range = [2, 4] })")
    ws = body["world_size"]
    if isinstance(ws, dict) and ("each" in ws or "subset" in ws):
        raise _err(source, "world_size", "can only be a number, a range or a choice")
    _check_world_bounds(ws, source)
    for section in ("loop", "after"):
        steps = body.get(section, [])
        if isinstance(steps, list):
            for i, st in enumerate(steps):
                if isinstance(st, dict) and "optional" in st and not isinstance(st["optional"], bool):
                    raise _err(source, f"{section}[{i}].optional", "must be true or false")
    for k, v in body.items():  # the template itself is a table, even with a key named like a marker
        check_markers(v, k, source)
    digest = hashlib.sha256(json.dumps(body, sort_keys=True, default=str).encode()).hexdigest()[:16]
    tname = name or str(body.get("name", "template"))
    if not isinstance(tname, str):
        raise _err(source, "name", "must be a plain string in a template")
    t = Template(name=tname, source=source, body=body, budget=fz.get("budget", 200),
                 invariants=fz.get("invariants", True), expect=fz.get("expect"),
                 description=fz.get("description", ""), digest=digest)
    for label, high in (("lowest", False), ("highest", True)):
        try:
            check_ops(t.scenario(Extreme(high)), source)
        except (ScenarioError, LimitError) as e:
            msg = str(e)
            if msg.startswith(source + ": "):
                msg = msg[len(source) + 2:]
            raise type(e)(f"{source}: {msg} (in the template's {label} instance)") from None
    return t


def _check_world_bounds(ws: Any, source: str) -> None:
    """world_size's range and choices within the schema's upper bound, before anything is
    drawn (per-rank markers would otherwise expand a world of 10**18 ranks)."""
    if isinstance(ws, dict) and isinstance(ws.get("range"), list):
        values = ws["range"]
    elif isinstance(ws, dict) and isinstance(ws.get("choice"), list):
        values = ws["choice"]
    else:
        values = [ws]
    for v in values:
        if _num(v) and v > MAX_WORLD_SIZE:
            raise _err(source, "world_size", f"{v} is more than {MAX_WORLD_SIZE} ranks")


def load_template(path: str | Path) -> Template:
    """Read and validate a template file (docs/fuzzing.md); named by its `name`, else the file's stem."""
    p = Path(path)
    data = read_toml(p, "template")
    name = data.get("name") if isinstance(data.get("name"), str) else p.stem
    return parse_template(data, source=str(p), name=name)
