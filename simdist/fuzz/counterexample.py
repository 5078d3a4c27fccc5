"""Counterexample files: a failing schedule written as a plain, hand-editable scenario file.

The file replays with `simdist run` (its `[expect]` is the failing verdict, so the replay
exits 0 when the failure reproduces) and with `simdist real` / `simdist compare` on real
processes. Its name is stable: the template's name, the failure kind and a hash of the
scenario's content, so the same counterexample found twice is one file.
"""

from __future__ import annotations

import hashlib
import json
import re
from pathlib import Path
from typing import Any

import tomli_w
import tomllib

from simdist.fuzz.template import Template


def canonical(d: dict[str, Any]) -> str:
    """One string per scenario dict (key order ignored): cache key and content hash."""
    return json.dumps(d, sort_keys=True, default=str)


def _toml_value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    if isinstance(v, (int, float)):
        return repr(v)
    if isinstance(v, str):
        return json.dumps(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else json.dumps(k)


def to_toml(doc: dict[str, Any]) -> str:
    """Compact, hand-editable TOML for a scenario dict (tables, [[loop]] steps, inline lists);
    checked to parse back to the same dict, else `tomli_w`'s rendering is used."""
    lines: list[str] = []
    tables = {k: v for k, v in doc.items() if isinstance(v, dict)}
    arrays = {k: v for k, v in doc.items() if isinstance(v, list) and v and all(isinstance(x, dict) for x in v)}
    for k, v in doc.items():
        if k not in tables and k not in arrays:
            lines.append(f"{_toml_key(k)} = {_toml_value(v)}")
    for k, v in tables.items():
        lines += ["", f"[{_toml_key(k)}]"] + [f"{_toml_key(a)} = {_toml_value(b)}" for a, b in v.items()]
    for k, v in arrays.items():
        for item in v:
            lines += ["", f"[[{_toml_key(k)}]]"] + [f"{_toml_key(a)} = {_toml_value(b)}" for a, b in item.items()]
    text = "\n".join(lines) + "\n"
    if tomllib.loads(text) != doc:  # pragma: no cover - fall back to the reference writer
        return tomli_w.dumps(doc)
    return text


def write_counterexample(d: dict[str, Any], template: Template, seed: int, out_dir: Path, explanation: list[str],
                         failure_key: str, summary: str, report_expect: dict[str, Any]) -> Path:
    """Write scenario dict `d` (a failing instance of `template`, failure class `failure_key`)
    under `out_dir`, with a header saying how it was found and how to replay it."""
    body = {k: v for k, v in d.items() if k not in ("name", "description", "expect")}
    digest = hashlib.sha256(canonical(body).encode()).hexdigest()[:10]
    kind = failure_key.split("/")[0].replace(":", "-")
    stem = f"{template.name}-{kind}-{digest}"
    doc: dict[str, Any] = {"name": stem,
                           "description": f"Counterexample to template {template.name} ({template.source}) found by "
                                          f"simdist fuzz --seed {seed}: {summary}"}
    doc.update(body)
    doc["expect"] = report_expect
    out_dir.mkdir(parents=True, exist_ok=True)
    path = out_dir / f"{stem}.toml"
    header = [
        f"# simdist fuzz counterexample (seed {seed}) for template {template.source}",
        f"# failure class: {failure_key}",
        "# shrunk by hypothesis (ranges low, choices first, optional steps dropped), then greedily (fewest ranks and inputs).",
        "# Replay: simdist run THIS_FILE  (exit 0 = the failure reproduces: [expect] is the failing verdict);",
        "#         simdist real THIS_FILE / simdist compare THIS_FILE on real torch.distributed processes.",
        "#",
        *[f"# {line}" for line in explanation],
        "",
    ]
    path.write_text("\n".join(header) + "\n" + to_toml(doc))
    return path
