"""Malformed and adversarial inputs (bench/malformed_inputs.py, tests/test_bad_input.py), and how
one is fed to simdist.

`make_case(index, rng, bases)` mutates a scenario or template of `bundled_bases(folder)` (values replaced by
extremes, wrong types, inf/nan, huge numbers, strings with markup, paths and emoji; keys
dropped or invented; lists bloated; tables nested; huge mismatched collectives; bytes
flipped, truncated, made non-UTF-8; special files such as /dev/zero, FIFOs and folders), a
function of `rng` only, so tests/test_bad_input.py can drive it with hypothesis.
`exercise(case, tmp)` runs it through the Python API: `load_scenario`/`parse_scenario`, then
`simulate`, `check_run` and the report's JSON; `load_template`/`parse_template`, then a
3-example `fuzz_template`.
"""

from __future__ import annotations

import json
import os
import random
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

from simdist.check.classify import check_run
from simdist.fuzz.runner import fuzz_template
from simdist.fuzz.template import load_template, parse_template
from simdist.scenario import load_scenario, parse_scenario
from simdist.sim import simulate

CASE_SECONDS = 10.0  # what one input may take at most

HUGE = [10**18, 2**63, 2**64 - 1, -(2**63), 10**30, 2**200]
ADVERSARIAL: list[Any] = [
    -1, 0, 1, 2, 3, 1025, 10**9, *HUGE, 0.5, -0.0, 1e-320, 1e300, -1e300, 3e38, 65505.0,
    float("inf"), float("-inf"), float("nan"), True, False, "2", "", "x" * 5000, "[/]", "[bold red]x[/]",
    "../../x", "/abs/path", "a\x00b", "\U0001F600", "rank", "iteration", "WORLD", "sum", "all_reduce",
    [], [1] * 3, [10**18], [-1], ["a"], {}, {"range": [0, 10**18]}, {"choice": []}, {"each": {"each": 2}},
    {"subset": [-1]}, {"range": [5, 1]}, {"range": [0, float("inf")]},
]
FIELD_VALUES: dict[str, list[Any]] = {
    "world_size": [0, -1, 1025, 10**18, "2", 2.0, True, {"range": [2, 10**18]}, {"choice": [2, 10**9]}],
    "timeout_s": [0, -1, float("inf"), float("nan"), 1e300, "10"],
    "counts": [[10**9, 10**9], [1, True], [1, "2"], [1] * 100000, [-1, 1], [2**63, 1], {"each": {"range": [0, 10**9]}}],
    "base": [10**9, 10**18, -5, 2.5],
    "numel": [0, 10**15, 2**60, 2**70, -3, 1.5, float("inf")],
    "value": [float("inf"), float("nan"), 1e300, -1, 300, "rank", "iteration", True, "3"],
    "dtype": ["int8", "uint8", "bool", "float16", "complex64", "int4"],
    "bucket_cap_mb": [float("inf"), 0, 1e-300, 1e300, 1e13, -1, "25"],
    "num_allreduces": [float("inf"), 10**12, -1, "3", True, 2**64],
    "seconds": [float("inf"), 1e300, -1, 1e9, "1"],
    "profile": ["/dev/zero", "/nonexistent/p.json", "/etc", "/proc/self/status", "/dev/null"],
    "preset": ["nope", "switch8", "", "ring"],
    "name": ["[/]", "x[/y]", "../../x", "/abs", "a\x00b", "\U0001F600", "é" * 50, "x" * 10000],
    "tag": [2**31, -(2**31) - 1, 10**18],
    "latency_us": [float("inf"), -1, 1e300],
    "bandwidth_gbps": [0, 1e-300, float("inf")],
}


@dataclass
class Case:
    """One generated input: a file (bytes, or a special path) or a dict for the API."""

    index: int
    kind: str  # "scenario" | "template"
    how: str  # "file" | "dict" | "path"
    label: str  # what was done to it
    data: Any = None  # bytes for "file", dict for "dict", a path for "path"




# ----------------------------------------------------------------------------- generation
def bundled_bases(folder: Path) -> tuple[list[dict[str, Any]], list[dict[str, Any]]]:
    """The scenarios in `folder` (a checkout's scenarios/) and the templates in its templates/:
    what the cases mutate."""
    scenarios = [tomllib.loads(p.read_text()) for p in sorted(folder.glob("*.toml"))]
    templates = [tomllib.loads(p.read_text()) for p in sorted((folder / "templates").glob("*.toml"))]
    return scenarios, templates


def _paths(x: Any, here: tuple = ()) -> list[tuple]:
    """Every path to a value inside `x` (dict keys and list indices)."""
    out = [here]
    if isinstance(x, dict):
        for k, v in x.items():
            out += _paths(v, (*here, k))
    elif isinstance(x, list):
        for i, v in enumerate(x[:50]):
            out += _paths(v, (*here, i))
    return out


def _set(d: Any, path: tuple, value: Any) -> Any:
    if not path:
        return value
    parent = d
    for p in path[:-1]:
        parent = parent[p]
    parent[path[-1]] = value
    return d


def _get(d: Any, path: tuple) -> Any:
    for p in path:
        d = d[p]
    return d


def _copy(x: Any) -> Any:
    return json.loads(json.dumps(x, allow_nan=True)) if not isinstance(x, bytes) else x


def _mutate(d: dict[str, Any], rng: random.Random) -> tuple[dict[str, Any], str]:
    """One mutation of a scenario/template dict, and what it was."""
    paths = _paths(d)[1:]
    op = rng.choice(["leaf", "leaf", "field", "field", "field", "drop", "invent", "retype", "bloat", "deepen",
                     "mismatch"])
    if op == "field" or not paths:
        name = rng.choice(list(FIELD_VALUES))
        value = rng.choice(FIELD_VALUES[name])
        spots = [p for p in paths if p and p[-1] == name]
        if spots:
            path = rng.choice(spots)
        else:
            path = {"counts": ("inputs", "counts"), "base": ("inputs", "base"), "profile": ("topology", "profile"),
                    "preset": ("topology", "preset"), "bucket_cap_mb": ("model", "bucket_cap_mb")}.get(name, (name,))
            if len(path) == 2 and not isinstance(d.get(path[0]), dict):
                d[path[0]] = {}
        return _set(d, path, _copy(value)), f"{'.'.join(map(str, path))} = {_show(value)}"
    path = rng.choice(paths)
    if op == "leaf":
        value = rng.choice(ADVERSARIAL)
        return _set(d, path, _copy(value)), f"{_where(path)} = {_show(value)}"
    if op == "drop":
        parent = _get(d, path[:-1])
        del parent[path[-1]]
        return d, f"{_where(path)} dropped"
    if op == "invent":
        target = _get(d, path)
        if not isinstance(target, dict):
            target = d
        key = rng.choice(["bogus", "name", "kind", "ranks", "optional", "range", "each", "expect", "fuzz", "x" * 300])
        target[key] = _copy(rng.choice(ADVERSARIAL))
        return d, f"{_where(path)}.{key[:20]} invented"
    if op == "retype":
        v = _get(d, path)
        new = rng.choice([[v], {"v": v}, str(v)[:100], bool(v) if not isinstance(v, (dict, list)) else v, None])
        return _set(d, path, _copy(new)), f"{_where(path)} retyped to {type(new).__name__}"
    if op == "bloat":
        v = _get(d, path)
        n = rng.choice([100, 500] if isinstance(v, (dict, list)) else [1000, 50_000, 200_000])
        return _set(d, path, [v] * n if not isinstance(v, str) else v * min(n, 100_000)), f"{_where(path)} x{n}"
    if op == "deepen":
        depth = rng.choice([20, 33, 60, 200])
        v = _get(d, path)
        for _ in range(depth):
            v = [v] if rng.random() < 0.5 else {"k": v}
        return _set(d, path, v), f"{_where(path)} nested {depth} deep"
    # mismatch: two ranks issue all_reduces of different huge sizes
    n = rng.choice([10**8, 10**10, 10**12, 2**47])
    d.setdefault("loop", [])
    if isinstance(d["loop"], list):
        d["loop"] += [{"kind": "collective", "op": "all_reduce", "numel": n, "ranks": [0]},
                      {"kind": "collective", "op": "all_reduce", "numel": n + 1, "ranks": [1]}]
    return d, f"mismatched all_reduce of {n} elements"


def _where(path: tuple) -> str:
    return ".".join(str(p) for p in path)[:80] or "top"


def _show(v: Any) -> str:
    text = repr(v)
    return text if len(text) <= 40 else text[:37] + "..."


def _bytes_case(text: str, rng: random.Random) -> tuple[bytes, str]:
    raw = text.encode()
    op = rng.choice(["non_utf8", "truncate", "nul", "flip", "bom", "deep", "bigint", "nan", "garbage"])
    if op == "non_utf8":
        k = rng.randrange(len(raw) + 1)
        return raw[:k] + rng.choice([b"\xff", b"\xc3\x28", b"\xed\xa0\x80"]) + raw[k:], "non-UTF-8 bytes"
    if op == "truncate":
        return raw[: rng.randrange(len(raw) + 1)], "truncated"
    if op == "nul":
        k = rng.randrange(len(raw) + 1)
        return raw[:k] + b"\x00" + raw[k:], "NUL byte"
    if op == "flip":
        b = bytearray(raw)
        for _ in range(rng.randint(1, 5)):
            if b:
                b[rng.randrange(len(b))] = rng.randrange(256)
        return bytes(b), "flipped bytes"
    if op == "bom":
        return b"\xef\xbb\xbf" + raw, "UTF-8 BOM"
    if op == "deep":
        n = rng.choice([40, 500, 5000])
        return raw + f"\ndeep = {'[' * n}{']' * n}\n".encode(), f"array nested {n} deep"
    if op == "bigint":
        return raw.replace(b"world_size = ", b"world_size = " + b"9" * rng.choice([4000, 5000]), 1), "huge integer"
    if op == "nan":
        return raw + rng.choice([b"\nseed = nan\n", b"\ntimeout_s = inf\n", b"\nx = -inf\n"]), "nan/inf literal"
    return bytes(rng.randrange(256) for _ in range(rng.randint(0, 300))), "random bytes"


SPECIAL_PATHS = ["/dev/zero", "/dev/null", "/etc", "/nonexistent/x.toml", "FIFO", "SYMLINK_ZERO", "BIG"]


def make_case(index: int, rng: random.Random, bases: tuple[list, list]) -> Case:
    """Case number `index`, a function of `rng` only (the property test passes hypothesis's)."""
    kind = "template" if rng.random() < 0.2 else "scenario"
    base = _copy(rng.choice(bases[1] if kind == "template" else bases[0]))
    r = rng.random()
    if r < 0.02:
        return Case(index, kind, "path", "special file", rng.choice(SPECIAL_PATHS))
    if r < 0.17:
        data, label = _bytes_case(tomli_w.dumps(base), rng)
        return Case(index, kind, "file", label, data)
    labels: list[str] = []
    for _ in range(rng.choice([1, 1, 2, 3])):
        try:
            base, label = _mutate(base, rng)
        except (KeyError, IndexError, TypeError):  # the path went away in an earlier mutation
            continue
        labels.append(label)
        if " x" in label:  # one bloat per case: bloating a bloated value multiplies sizes
            break
    try:
        text = tomli_w.dumps(base) if rng.random() < 0.5 else None
    except (TypeError, ValueError):
        text = None  # not TOML (None, nan keys, ...): the API takes it as a dict
    if text is not None:
        return Case(index, kind, "file", "; ".join(labels), text.encode())
    return Case(index, kind, "dict", "; ".join(labels), base)


# ----------------------------------------------------------------------------- running one case
def special_path(path: str, tmp: Path) -> Path:
    if path == "FIFO":
        p = tmp / "fifo.toml"
        if not p.exists():
            os.mkfifo(p)
        return p
    if path == "SYMLINK_ZERO":
        p = tmp / "zero.toml"
        if not p.exists():
            p.symlink_to("/dev/zero")
        return p
    if path == "BIG":
        p = tmp / "big.toml"
        if not p.exists():
            p.write_text("world_size = 2\n[inputs]\ncounts = [" + "1, " * 400_000 + "1]\n")
        return p
    return Path(path)


def _strict_json(text: str) -> bool:
    def no(c: str) -> Any:
        raise ValueError(c)

    try:
        json.loads(text, parse_constant=no)
        return True
    except ValueError:
        return False


def materialise(case: Case, tmp: Path) -> Path | None:
    """The path a file case is read from, its file written (None for a dict case). Kept apart
    from `exercise` so that the time a case takes is simdist's, not the time this host takes
    to write a multi-megabyte input file (seconds on a busy disk)."""
    if case.how == "dict":
        return None
    if case.how == "file":
        path = tmp / f"case-{case.index}.toml"
        path.write_bytes(case.data)
        return path
    return special_path(case.data, tmp)


def exercise(case: Case, tmp: Path, fuzz: bool = True, path: Path | None = None) -> tuple[str, str, bool]:
    """Run `case` through the Python API: (status, message, JSON valid). Raises what
    simdist raises (a `SimdistError` is a clean rejection; the caller classifies). A valid
    template is fuzzed for 3 examples when `fuzz` (not inside a hypothesis test: no nesting).
    `path`: the case's file, already written by `materialise` (else written here)."""
    source = f"case-{case.index}"
    if case.how == "dict":
        loaded = (parse_template(case.data, source=source) if case.kind == "template"
                  else parse_scenario(case.data, source=source))
    else:
        path = path if path is not None else materialise(case, tmp)
        assert path is not None
        loaded = load_template(path) if case.kind == "template" else load_scenario(path)
    if case.kind == "template":
        if not fuzz:
            return "accepted", "", True
        out = tmp / "out"
        res = fuzz_template(loaded, budget=3, seed=0, out_dir=out, use_db=False, shrink=False)
        for c in res.counterexamples:
            if c.path is not None and Path(c.path).resolve().parent != out.resolve():
                raise AssertionError(f"counterexample written outside --out: {c.path}")
        return "accepted", "", _strict_json(json.dumps(res.to_dict()))
    report = simulate(loaded)
    check_run(report, loaded)
    return "accepted", "", _strict_json(report.to_json())
