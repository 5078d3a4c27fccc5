"""Finding and reading a job's Flight Recorder dumps and torchelastic error files.

Input is what a user holds after a job hung or failed: files, or folders of them (walked
like torch's analyzer walks its trace folder). A dump's rank is in its file name, as
torch's DebugInfoWriter writes it: ``<TORCH_FR_DUMP_TEMP_FILE prefix><global rank>``
(e.g. ``comm_lib_trace_rank_3``), optionally with ``.json``/``.pkl``; a dump holds no rank
itself. A rank's uncaught exception is in torchelastic's error file (``TORCHELASTIC_ERROR_FILE``):
``<local rank>/error.json`` as torchelastic lays them out, or ``error_<rank>.json``.

In a folder, files named otherwise (logs, sockets) are skipped, and so are files named like
a dump that are neither pickle nor JSON (a core file ``core.1234``); a pickle or JSON that is
not a readable dump (truncated, another format, a pickle that asks to run code) is an
error, as is any file given by name that is neither a dump nor an error file.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from simdist.errors import DumpError
from simdist.flightrec.format import DEFAULT_PG_DESC, ERROR_FILE_NAME, FORMAT_VERSION, fr_backend, parse_version
from simdist.flightrec.unpickle import Form, decode_dump, sniff

_DUMP_NAME = re.compile(r"^(?P<prefix>.*?)(?P<rank>\d+)(?:\.(?:json|pkl|pickle))?$")
_ERROR_NAME = re.compile(r"^error[_-]?(?P<rank>\d+)\.json$")
_EXCEPTION = re.compile(r"^(?P<type>[A-Za-z_][\w.]*): (?P<message>.*)$", re.DOTALL)


@dataclass
class RankDump:
    """One rank's dump, as torch wrote it."""

    rank: int
    path: Path
    form: Form
    doc: dict[str, Any]

    @property
    def entries(self) -> list[dict[str, Any]]:
        return list(self.doc.get("entries") or [])

    @property
    def version(self) -> str:
        return str(self.doc.get("version"))


@dataclass
class ErrorFile:
    """One rank's uncaught exception, as torchelastic's ``@record`` / ErrorHandler wrote it."""

    rank: int
    path: Path
    type: str
    message: str
    callstack: str = ""


@dataclass
class Dumps:
    """Every rank's dump and error file of one job."""

    dumps: dict[int, RankDump]
    errors: dict[int, ErrorFile] = field(default_factory=dict)
    world_size: int = 0
    notes: list[str] = field(default_factory=list)

    @property
    def version(self) -> str:
        versions = sorted({d.version for d in self.dumps.values()}, key=lambda v: parse_version(v) or (0, 0))
        return versions[-1] if versions else FORMAT_VERSION

    @property
    def backend(self) -> str:
        for d in self.dumps.values():
            for e in d.entries:
                b = fr_backend(str(e.get("profiling_name", "")))
                if b:
                    return b
        return "gloo"

    @property
    def missing(self) -> list[int]:
        """Ranks of the job without a dump."""
        return [r for r in range(self.world_size) if r not in self.dumps]


def load_dumps(paths: list[Path]) -> Dumps:
    """Read every dump and error file under `paths` (files or folders); DumpError on bad input."""
    found: list[tuple[Path, bool]] = []  # (file, given by name)
    for p in paths:
        if p.is_dir():
            found += [(f, False) for f in _walk(p)]
        elif p.is_file():
            found.append((p, True))
        else:
            raise DumpError(f"{p}: no such file or folder")
    dumps: dict[int, RankDump] = {}
    errors: dict[int, ErrorFile] = {}
    skipped: list[str] = []
    for path, named in found:
        item = _read(path, named)
        if item is None:
            skipped.append(path.name)
            continue
        table: dict[int, Any] = dumps if isinstance(item, RankDump) else errors
        if item.rank in table:
            what = "dumps" if isinstance(item, RankDump) else "error files"
            raise DumpError(f"two {what} for rank {item.rank}: {table[item.rank].path} and {path}")
        table[item.rank] = item
    if not dumps:
        raise DumpError(f"{', '.join(map(str, paths))}: no Flight Recorder dump found (files named "
                        "<prefix><rank>, as TORCH_FR_DUMP_TEMP_FILE makes them)")
    out = Dumps(dumps, errors, world_size=_world_size(dumps, errors))
    if skipped:
        out.notes.append(f"skipped files that are neither pickle nor JSON: {', '.join(skipped)}")
    versions = sorted({d.version for d in dumps.values()})
    if len(versions) > 1:
        out.notes.append(f"dumps of different format versions: {', '.join(versions)}")
    if out.missing:
        out.notes.append(f"no dump for rank(s) {out.missing}: judged as ranks that left no record")
    return out


def _walk(folder: Path) -> list[Path]:
    out = []
    for root, dirs, files in os.walk(folder):
        dirs.sort()
        for f in sorted(files):
            path = Path(root) / f
            if _DUMP_NAME.match(f) or _error_rank(path) is not None:
                out.append(path)
    return out


def _error_rank(path: Path) -> int | None:
    """The rank of an error file's name (torchelastic's ``<rank>/error.json`` or ``error_<rank>.json``)."""
    if path.name == ERROR_FILE_NAME and path.parent.name.isdigit():
        return int(path.parent.name)
    m = _ERROR_NAME.match(path.name)
    return int(m.group("rank")) if m else None


def _read(path: Path, named: bool) -> RankDump | ErrorFile | None:
    try:
        data = path.read_bytes()
    except OSError as e:
        raise DumpError(f"{path}: cannot read ({e.strerror or type(e).__name__})") from None
    err_rank = _error_rank(path)
    if err_rank is not None:
        return _error_file(path, err_rank, data)
    if not named and sniff(data) is None:
        return None  # in a folder, a file named like a dump that is no pickle or JSON (a core file, a log)
    m = _DUMP_NAME.match(path.name)
    if m is None:
        if named and path.name == ERROR_FILE_NAME:
            raise DumpError(f"{path}: an error file needs its rank: put it in a folder named by the rank "
                            "(torchelastic's layout) or name it error_<rank>.json")
        raise DumpError(f"{path}: no rank in the file name (torch names dumps <prefix><rank>)")
    doc, form = decode_dump(data, str(path))
    return RankDump(int(m.group("rank")), path, form, doc)


def _error_file(path: Path, rank: int, data: bytes) -> ErrorFile:
    try:
        doc = json.loads(data.decode("utf-8"))
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DumpError(f"{path}: not a torchelastic error file (not valid JSON: {e})") from None
    msg = doc.get("message") if isinstance(doc, dict) else None
    extra: dict[str, Any] = {}
    if isinstance(msg, dict):
        extra = msg.get("extraInfo") or {}
        msg = msg.get("message")
    if not isinstance(msg, str):
        raise DumpError(f"{path}: not a torchelastic error file (no 'message')")
    m = _EXCEPTION.match(msg)
    etype, text = (m.group("type"), m.group("message")) if m else ("Exception", msg)
    return ErrorFile(rank, path, etype.rsplit(".", 1)[-1], text, str(extra.get("py_callstack") or ""))


def _world_size(dumps: dict[int, RankDump], errors: dict[int, ErrorFile]) -> int:
    """The job's world size: the default group's size where pg_config names ranks (NCCL), else
    the highest rank seen (Gloo's pg_config names none)."""
    n = max([*dumps, *errors]) + 1
    for d in dumps.values():
        for cfg in (d.doc.get("pg_config") or {}).values():
            if isinstance(cfg, dict) and cfg.get("desc") == DEFAULT_PG_DESC:
                n = max(n, len(parse_ranks(cfg.get("ranks"))))
    return n


def parse_ranks(value: Any) -> list[int]:
    """A pg_config's ranks: a list, or its string form ("[0, 1]", as torch writes it)."""
    if isinstance(value, str):
        try:
            value = json.loads(value)
        except json.JSONDecodeError:
            return []
    if not isinstance(value, list) or not all(isinstance(r, int) for r in value):
        return []
    return list(value)
