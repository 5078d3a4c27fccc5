"""200 malformed scenario files through the CLI (issue 12): no exit 3, no traceback, and every
message names the field that is wrong -- all of a file's problems at once, one line each.

The files are the bundled scenarios with mistakes a user makes by hand (a typo'd key, a
wrong type, a number out of range, a name that does not resolve, a condition that cannot
hold, a construct in the wrong place), one to three per file; each mistake knows the field
its error must name. `simdist check` and `simdist run` take all 200 in one call each."""

from __future__ import annotations

import copy
import itertools
import re
from collections.abc import Callable
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

from .conftest import SCENARIOS, run_cli

Mistake = Callable[[dict[str, Any]], str | None]  # edits a scenario in place; returns the field named, or None


def _step(d: dict[str, Any], kinds: tuple[str, ...] = ()) -> int | None:
    """Index of the first loop step (of one of `kinds`, if given)."""
    return next((k for k, st in enumerate(d.get("loop", [])) if not kinds or st.get("kind") in kinds), None)


def _on_step(kinds: tuple[str, ...], edit: Callable[[dict[str, Any]], str]) -> Mistake:
    def mistake(d: dict[str, Any]) -> str | None:
        k = _step(d, kinds)
        if k is None:
            return None
        return f"loop[{k}].{edit(d['loop'][k])}"
    return mistake


def _set(key: str, value: Any, field: str | None = None) -> Mistake:
    def mistake(d: dict[str, Any]) -> str:
        d[key] = value
        return field or key
    return mistake


def _in_table(table: str, key: str, value: Any, field: str | None = None) -> Mistake:
    def mistake(d: dict[str, Any]) -> str | None:
        if not isinstance(d.get(table), dict):
            return None
        d[table][key] = value
        return field or f"{table}.{key}"
    return mistake


def _counts_length(d: dict[str, Any]) -> str:
    d["inputs"] = {"counts": [1] * (d["world_size"] + 1)}
    return "inputs.counts"


def _expect_length(d: dict[str, Any]) -> str:
    d.setdefault("expect", {})["inputs_processed"] = [0] * (d["world_size"] + 2)
    return "expect.inputs_processed"


def _stop_after(d: dict[str, Any]) -> str:
    d.setdefault("after", []).append({"kind": "stop"})
    return f"after[{len(d['after']) - 1}].kind"


def _flag_unknown(d: dict[str, Any]) -> str:
    d.setdefault("loop", []).append({"kind": "stop", "flag": "never_observed"})
    return f"loop[{len(d['loop']) - 1}].flag"


def _forward_unknown_model(d: dict[str, Any]) -> str | None:
    k = _step(d, ("forward", "backward"))
    if k is None:
        return None
    d["loop"][k]["model"] = "no_such_model"
    return f"loop[{k}].model"


def _join_unknown(d: dict[str, Any]) -> str | None:
    if "join" not in d:
        return None
    d["join"]["joinables"] = [*d["join"]["joinables"], "ghost"]
    return f"join.joinables[{len(d['join']['joinables']) - 1}]"


def _model_group(d: dict[str, Any]) -> str | None:
    if "model" not in d:
        return None
    d["model"]["group"] = "no_such_group"
    return "model.group"


def _duplicate_group(d: dict[str, Any]) -> str:
    d["groups"] = [*d.get("groups", []), {"name": "twice", "ranks": [0]}, {"name": "twice", "ranks": [0]}]
    return f"groups[{len(d['groups']) - 1}].name"


def _seconds_per_rank(d: dict[str, Any]) -> str:
    d.setdefault("loop", []).insert(0, {"kind": "compute", "seconds": [0.1] * (d["world_size"] + 1)})
    return "loop[0].seconds"


def _nested_rank(d: dict[str, Any]) -> str:
    d.setdefault("loop", []).insert(0, {"kind": "compute", "seconds": 0.0,
                                        "any": [{"below": 2}, {"not": {"ranks": [d["world_size"] + 3]}}]})
    return "loop[0].any[1].not.ranks"


MISTAKES: dict[str, Mistake] = {
    "unknown top-level key": _set("colour", "red"),
    "world_size as text": _set("world_size", "two"),
    "world_size zero": _set("world_size", 0),
    "timeout_s negative": _set("timeout_s", -1.0),
    "on_finish unknown": _set("on_finish", "vanish"),
    "backend unknown": _set("backend", "mpi"),
    "counts length": _counts_length,
    "inputs both forms": _in_table("inputs", "base", 3, "inputs"),  # the table: which key is the mistake?
    "expect length": _expect_length,
    "expect outcome": lambda d: (d.setdefault("expect", {}).__setitem__("outcome", "fine"), "expect.outcome")[1],
    "step unknown key": _on_step((), lambda st: (st.__setitem__("colour", 1), "colour")[1]),
    "step unknown kind": _on_step((), lambda st: (st.__setitem__("kind", "teleport"), "kind")[1]),
    "every zero": _on_step((), lambda st: (st.__setitem__("every", 0), "every")[1]),
    "offset not below every": _on_step((), lambda st: (st.update(every=3, offset=3), "offset")[1]),
    "offset without every": _on_step((), lambda st: (st.pop("every", None), st.__setitem__("offset", 1), "offset")[2]),
    "rank out of range": _on_step((), lambda st: (st.__setitem__("ranks", [99]), "ranks")[1]),
    "collective group unknown": _on_step(("collective",), lambda st: (st.__setitem__("group", "nope"), "group")[1]),
    "collective numel negative": _on_step(("collective",), lambda st: (st.__setitem__("numel", -4), "numel")[1]),
    "collective dtype unknown": _on_step(("collective",), lambda st: (st.__setitem__("dtype", "float7"), "dtype")[1]),
    "collective value text": _on_step(("collective",), lambda st: (st.__setitem__("value", "lots"), "value")[1]),
    "collective op unknown": _on_step(("collective",), lambda st: (st.__setitem__("op", "allreduce"), "op")[1]),
    "compute seconds negative": _on_step(("compute", "sleep"),
                                         lambda st: (st.__setitem__("seconds", -1.0), "seconds")[1]),
    "forward no_sync text": _on_step(("forward",), lambda st: (st.__setitem__("no_sync", "maybe"), "no_sync")[1]),
    "forward unknown model": _forward_unknown_model,
    "stop after the loop": _stop_after,
    "flag never observed": _flag_unknown,
    "join unknown joinable": _join_unknown,
    "join kwargs not a table": _in_table("join", "kwargs", 3),
    "model group unknown": _model_group,
    "model params empty": _in_table("model", "params", []),
    "model dtype unknown": _in_table("model", "dtype", "float7"),
    "optimizer kind unknown": _in_table("optimizer", "kind", "lion"),
    "duplicate group": _duplicate_group,
    "per-rank seconds length": _seconds_per_rank,
    "nested condition rank": _nested_rank,
}


def _malformed(n: int) -> list[tuple[str, str, list[str]]]:
    """`n` (file name, TOML text, fields its errors must name), deterministic: mistakes
    cycled over the bundled scenarios, every seventh file with two or three mistakes."""
    bases = [tomllib.loads(p.read_text()) for p in sorted(SCENARIOS.glob("*.toml"))]
    names = list(MISTAKES)
    out: list[tuple[str, str, list[str]]] = []
    for i in itertools.count():
        if len(out) == n:
            return out
        d = copy.deepcopy(bases[i % len(bases)])
        picks = [names[(i + j * 11) % len(names)] for j in range(1 + (i % 7 == 0) + (i % 14 == 0))]
        fields = [f for f in (MISTAKES[m](d) for m in picks) if f is not None]
        if fields and "world_size" not in fields[1:]:  # a later world_size error hides what depends on it
            out.append((f"m{len(out):03d}.toml", tomli_w.dumps(d), fields))
    raise AssertionError  # pragma: no cover


_FIELD_LINE = re.compile(r"^error: (?P<file>\S+\.toml): (?P<field>[A-Za-z_][\w.\[\]]*): \S")


def test_200_malformed_files_are_bad_input_each_error_naming_its_field(tmp_path):
    files = _malformed(200)
    assert len({text for _, text, _ in files}) == 200  # 200 different files
    paths = []
    for name, text, _ in files:
        (tmp_path / name).write_text(text)
        paths.append(str(tmp_path / name))
    for command in ("check", "run"):
        res = run_cli(command, *paths, timeout=600)
        assert res.returncode == 2, res.stdout[-2000:] + res.stderr[-2000:]
        assert "Traceback" not in res.stderr + res.stdout and "internal error" not in res.stderr
        assert "200 files: 0 passed, 0 failed, 200 bad input (exit 2)" in res.stdout
        named: dict[str, list[str]] = {}
        for line in res.stderr.splitlines():
            m = _FIELD_LINE.match(line)
            assert m, f"an error line that names no field: {line!r}"
            named.setdefault(Path(m["file"]).name, []).append(m["field"])
        for name, _, fields in files:
            for f in fields:
                assert f in named.get(name, []), f"{name}: expected an error naming {f}, got {named.get(name)}"


def test_toml_that_does_not_parse_names_its_line(tmp_scenario):
    p = tmp_scenario("world_size = 2\n[inputs\ncounts = [1, 1]\n")
    res = run_cli("check", str(p))
    assert res.returncode == 2 and "Traceback" not in res.stderr
    assert re.match(rf"error: {re.escape(str(p))}: not valid TOML \(.*line 2", res.stderr), res.stderr


def test_output_path_mistakes_exit_2_before_any_file_is_read(tmp_path):
    paths = [str(tmp_path / name) for name, text, _ in _malformed(3) if (tmp_path / name).write_text(text)]
    for args in (["run", *paths, "--trace-out", str(tmp_path / "missing" / "{name}.json")],
                 ["check", *paths, "--graph", str(tmp_path / "missing" / "{name}.dot")],
                 ["schema", "--out", str(tmp_path)]):
        res = run_cli(*args)
        assert res.returncode == 2 and "Traceback" not in res.stderr, (args, res.stderr)
        assert res.stderr.count("error:") == 1 and re.match(r"error: (trace-out|graph|out): ", res.stderr), res.stderr
