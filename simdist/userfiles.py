"""Reading what users hand simdist (scenario and template TOML, calibrated profile JSON), so
that no file and no dict can crash, hang or exhaust the loader.

Everything a user can write is checked here before any schema looks at it, and every
problem is one `ScenarioError` line naming the file and the field:

* a file must be a regular file (not ``/dev/zero``, a FIFO or a folder) of at most
  `limits.FILE_BYTES` bytes, read through one descriptor (no check-then-open race), and
  UTF-8 text (a BOM is allowed);
* TOML and JSON that Python's parsers cannot take (bad syntax, nesting beyond the parser's
  recursion, integers over Python's 4,300-digit conversion limit, JSON's ``NaN`` and
  ``Infinity``) are errors, not tracebacks;
* the parsed data (or a dict from the Python API) is walked once, without recursion
  (`check_data`): at most `limits.MAX_DEPTH` levels and `limits.DATA_ITEMS` values, string
  keys, integers within 64 bits, and no ``inf`` or ``nan`` anywhere: simdist rejects them
  instead of guessing what a non-finite latency, timeout or count would mean.
"""

from __future__ import annotations

import json
import math
import os
import stat
import sys
from pathlib import Path
from typing import Any

import tomllib

from simdist.errors import ScenarioError
from simdist.limits import DATA_ITEMS, FILE_BYTES, INT64_MIN, MAX_DEPTH

UINT64_MAX = (1 << 64) - 1


def read_text(path: str | Path, what: str) -> str:
    """The UTF-8 text of the regular file at `path`, at most `limits.FILE_BYTES` bytes."""
    p = Path(path)
    try:
        # O_NONBLOCK: opening a FIFO must not wait for a writer; the fstat below rejects it
        fd = os.open(p, os.O_RDONLY | getattr(os, "O_NONBLOCK", 0) | getattr(os, "O_CLOEXEC", 0))
    except (OSError, ValueError) as err:  # ValueError: a NUL in the path
        raise ScenarioError(f"{p}: cannot read {what} file ({_reason(err)})") from None
    try:
        st = os.fstat(fd)
        if not stat.S_ISREG(st.st_mode):
            raise ScenarioError(f"{p}: {what} file is not a regular file ({_kind(st.st_mode)})")
        limit = FILE_BYTES.value()
        data = _read_at_most(fd, limit + 1)
    except OSError as err:
        raise ScenarioError(f"{p}: cannot read {what} file ({_reason(err)})") from None
    finally:
        os.close(fd)
    if len(data) > limit:
        FILE_BYTES.check(max(len(data), st.st_size), str(p), f"the {what} file has more than {limit:,} bytes")
    try:
        return data.decode("utf-8-sig")
    except UnicodeDecodeError as err:
        line = data.count(b"\n", 0, err.start) + 1
        raise ScenarioError(f"{p}: {what} file is not UTF-8 text (byte 0x{data[err.start]:02x} at line {line}, "
                            f"offset {err.start})") from None


def _read_at_most(fd: int, n: int) -> bytes:
    chunks, left = [], n
    while left > 0:
        chunk = os.read(fd, min(left, 1 << 16))
        if not chunk:
            break
        chunks.append(chunk)
        left -= len(chunk)
    return b"".join(chunks)


def _reason(err: BaseException) -> str:
    return getattr(err, "strerror", None) or str(err)


def _kind(mode: int) -> str:
    for test, name in ((stat.S_ISDIR, "a folder"), (stat.S_ISCHR, "a character device"),
                       (stat.S_ISBLK, "a block device"), (stat.S_ISFIFO, "a FIFO"), (stat.S_ISSOCK, "a socket")):
        if test(mode):
            return name
    return "not a plain file"


def read_toml(path: str | Path, what: str = "scenario") -> dict[str, Any]:
    """A TOML file as a dict whose shape `check_data` accepts, or a one-line ScenarioError."""
    text = read_text(path, what)
    try:
        data = tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(f"{path}: not valid TOML ({err})") from None
    except RecursionError:
        raise ScenarioError(f"{path}: not valid TOML (nested too deeply to parse)") from None
    except ValueError:  # int() beyond sys.get_int_max_str_digits(), the only other ValueError
        raise ScenarioError(f"{path}: not valid TOML (an integer has more than {sys.get_int_max_str_digits():,} "
                            "digits)") from None
    check_data(data, str(path))
    return data


_REJECT = object()


def read_json(path: str | Path, what: str, *, infinity: Any = _REJECT) -> Any:
    """A JSON file whose shape `check_data` accepts. Strict: ``NaN`` and ``-Infinity`` are
    errors, and so is ``Infinity`` unless the caller says what it stands for (`infinity`)."""
    text = read_text(path, what)

    def constant(name: str) -> Any:
        if name == "Infinity" and infinity is not _REJECT:
            return infinity
        raise ValueError(f"{name} is not a finite number")

    try:
        data = json.loads(text, parse_constant=constant)
    except RecursionError:
        raise ScenarioError(f"{path}: not valid JSON (nested too deeply to parse)") from None
    except ValueError as err:  # json.JSONDecodeError is one
        raise ScenarioError(f"{path}: not valid JSON ({_first_line(err)})") from None
    check_data(data, str(path))
    return data


def _first_line(err: BaseException) -> str:
    text = str(err).strip().splitlines()
    return text[0] if text else type(err).__name__


def check_data(data: Any, source: str) -> None:
    """Reject, naming the field, what no schema should have to look at: nesting deeper than
    `limits.MAX_DEPTH`, more than `limits.DATA_ITEMS` values, non-string keys, integers
    beyond 64 bits, inf and nan. Iterative, so a self-containing dict is only "too deep";
    a container's size counts before its items are looked at, so a huge one is refused at once."""
    budget = DATA_ITEMS.value()
    _check_scalar(data, (), source)
    stack: list[tuple[Any, tuple[str | int, ...]]] = [(data, ())] if isinstance(data, (dict, list, tuple)) else []
    seen = 1
    while stack:
        value, path = stack.pop()
        if len(path) > MAX_DEPTH:
            raise ScenarioError(f"{source}: {format_path(path[:3])}...: nested more than {MAX_DEPTH} levels deep")
        seen += len(value)
        if seen > budget:
            DATA_ITEMS.check(seen, source, f"it holds more than {budget:,} values")
        if isinstance(value, dict):
            for key in value:
                if not isinstance(key, str):
                    raise ScenarioError(f"{source}: {format_path(path)}: keys must be strings, not {type(key).__name__}")
            items: Any = value.items()
        else:
            items = enumerate(value)
        inner = []
        for k, v in items:
            if isinstance(v, (dict, list, tuple)):
                inner.append((v, (*path, k)))
            else:
                _check_scalar(v, (*path, k), source)
        stack.extend(reversed(inner))


def _check_scalar(value: Any, path: tuple[str | int, ...], source: str) -> None:
    if isinstance(value, float) and not math.isfinite(value):
        raise ScenarioError(f"{source}: {format_path(path)}: {value} is not a finite number "
                            "(inf and nan are not allowed)")
    if isinstance(value, int) and not isinstance(value, bool) and not INT64_MIN <= value <= UINT64_MAX:
        raise ScenarioError(f"{source}: {format_path(path)}: a {value.bit_length()}-bit integer is out of range "
                            "(at most 64 bits)")


def format_path(parts: tuple[str | int, ...] | list[str | int]) -> str:
    """A field's dotted path as errors name it: ``loop[2].value``."""
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "scenario"
