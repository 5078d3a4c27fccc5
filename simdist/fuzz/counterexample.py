"""Counterexample files: a failing schedule written as a plain, hand-editable scenario file.

The file replays with `simdist run` (its `[expect]` is the failing verdict, so the replay
exits 0 when the failure reproduces) and with `simdist real` / `simdist compare` on real
processes. Its name is stable: the template's name, the failure kind and a hash of the
scenario's content, so the same counterexample found twice is one file.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
import unicodedata
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
        return toml_string(v)
    if isinstance(v, list):
        return "[" + ", ".join(_toml_value(x) for x in v) + "]"
    if isinstance(v, dict):
        return "{ " + ", ".join(f"{_toml_key(k)} = {_toml_value(x)}" for k, x in v.items()) + " }" if v else "{}"
    raise TypeError(f"cannot write {type(v).__name__} to TOML")


def toml_string(s: str) -> str:
    """`s` as a TOML basic string that reads back as `s`: quote, backslash and control
    characters escaped, everything else (emoji included) written as it is. (JSON's escapes
    are not TOML's: JSON writes an emoji as a surrogate pair, which TOML rejects.)"""
    out = []
    for ch in s:
        o = ord(ch)
        if ch in _ESCAPES:
            out.append(_ESCAPES[ch])
        elif o < 0x20 or o == 0x7F:
            out.append(f"\\u{o:04x}")
        else:
            out.append(ch)
    return '"' + "".join(out) + '"'


_ESCAPES = {'"': '\\"', "\\": "\\\\", "\b": "\\b", "\t": "\\t", "\n": "\\n", "\f": "\\f", "\r": "\\r"}


def _toml_key(k: str) -> str:
    return k if re.fullmatch(r"[A-Za-z0-9_-]+", k) else toml_string(k)


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
    if _reads_back(text, doc):
        return text
    return tomli_w.dumps(doc)  # pragma: no cover - the reference writer, should ours ever miss


def _reads_back(text: str, doc: dict[str, Any]) -> bool:
    try:
        return tomllib.loads(text) == doc
    except tomllib.TOMLDecodeError:
        return False


# --------------------------------------------------------------------------- files
def safe_name(name: str, fallback: str = "template", max_len: int = 60) -> str:
    """A file-name part made of ASCII letters, digits, '.', '_' and '-' only, never starting
    with '.' or '-' (no '/', no '..', no NUL, no absolute path: whatever a template's name
    says, its counterexamples stay inside the output folder). Accents lose their marks;
    anything else becomes '-'."""
    ascii_text = unicodedata.normalize("NFKD", name).encode("ascii", "ignore").decode()
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", ascii_text)
    slug = re.sub(r"-{2,}", "-", slug).strip("-._")[:max_len].strip("-._")
    return slug or fallback


def _scalar_text(s: str) -> str:
    """`s` without lone surrogates (a Python str from the API may hold them; no file can)."""
    return "".join("\ufffd" if 0xD800 <= ord(ch) <= 0xDFFF else ch for ch in s)


def _clean(x: Any) -> Any:
    """`x` as TOML can hold it: strings of Unicode scalars, and no None in tables (a key set
    to None from the Python API means "not given", which TOML says by leaving it out)."""
    if isinstance(x, str):
        return _scalar_text(x)
    if isinstance(x, dict):
        return {_scalar_text(k): _clean(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_clean(v) for v in x]
    return x


def _comment(text: str) -> str:
    """One TOML comment line: control characters (a newline would end the comment) as spaces."""
    return "# " + re.sub(r"[\x00-\x08\x0a-\x1f\x7f]", " ", _scalar_text(text))


STATES = {
    "shrunk": "shrunk by hypothesis (ranges low, choices first, optional steps dropped), then greedily "
              "(fewest ranks and inputs).",
    "unshrunk": "NOT SHRUNK YET: written as soon as it was found; the search went on and replaces this file "
                "with the shrunk one when it ends.",
    "interrupted": "the search was interrupted (Ctrl-C): the smallest failing schedule found so far, perhaps "
                   "not minimal.",
}


def counterexample_path(d: dict[str, Any], template: Template, out_dir: Path, failure_key: str) -> Path:
    """Where `d` goes: OUT_DIR/<template>-<kind>-<content hash>.toml, names made safe."""
    body = {k: v for k, v in d.items() if k not in ("name", "description", "expect")}
    digest = hashlib.sha256(canonical(_clean(body)).encode()).hexdigest()[:10]
    kind = safe_name(failure_key.split("/")[0], "failure")
    path = out_dir / f"{safe_name(template.name)}-{kind}-{digest}.toml"
    if path.resolve().parent != out_dir.resolve():  # pragma: no cover - safe_name makes this impossible
        raise ValueError(f"counterexample path {path} escapes {out_dir}")
    return path


def write_counterexample(d: dict[str, Any], template: Template, seed: int, out_dir: Path, explanation: list[str],
                         failure_key: str, summary: str, report_expect: dict[str, Any],
                         state: str = "shrunk") -> Path:
    """Write scenario dict `d` (a failing instance of `template`, failure class `failure_key`)
    under `out_dir` and nowhere else, with a header saying how it was found (`state`: one
    of STATES) and how to replay it. The file appears whole or not at all (written aside,
    then renamed), so an interrupted fuzzer leaves no half file."""
    path = counterexample_path(d, template, out_dir, failure_key)
    body = {k: v for k, v in _clean(d).items() if k not in ("name", "description", "expect")}
    doc: dict[str, Any] = {"name": path.stem,
                           "description": _scalar_text(f"Counterexample to template {template.name} "
                                                       f"({template.source}) found by simdist fuzz --seed {seed}: "
                                                       f"{summary}")}
    doc.update(body)
    doc["expect"] = _clean(report_expect)
    header = [
        _comment(f"simdist fuzz counterexample (seed {seed}) for template {template.source}"),
        _comment(f"failure class: {failure_key}"),
        _comment(STATES[state]),
        "# Replay: simdist run THIS_FILE  (exit 0 = the failure reproduces: [expect] is the failing verdict);",
        "#         simdist real THIS_FILE / simdist compare THIS_FILE on real torch.distributed processes.",
        "#",
        *[_comment(line) for line in explanation],
        "",
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    text = "\n".join(header) + "\n" + to_toml(doc)
    tmp = path.with_name(f".{path.name}.tmp")
    try:
        tmp.write_text(text, encoding="utf-8")
        os.replace(tmp, path)
    except BaseException:  # a full disk, a second Ctrl-C: no stray file either
        tmp.unlink(missing_ok=True)
        raise
    return path
