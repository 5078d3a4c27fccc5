"""Decoding one dump's bytes: pickle or JSON, with nothing in a pickle allowed to run code.

A pickle is a program: `pickle.load` on a file from elsewhere can import any module and
call any function (``os.system`` included). torch's Flight Recorder pickles only plain
values -- dicts, lists, tuples, strings, numbers, booleans, None (its opcodes are PROTO,
EMPTY_DICT, BINUNICODE, BININT, TUPLE2, ... and never GLOBAL) -- so the reader here admits
exactly those: every opcode that would name a class or a function (GLOBAL, STACK_GLOBAL,
INST, OBJ, EXT*, and so REDUCE/NEWOBJ, which need one) goes through `find_class`, which
refuses, and persistent ids are refused too. A refused pickle has run nothing.
"""

from __future__ import annotations

import io
import json
import pickle
from typing import Any, Literal

from simdist.errors import DumpError
from simdist.flightrec.format import parse_version

Form = Literal["pickle", "json"]
_PLAIN = (dict, list, tuple, str, int, float, bool, type(None))  # what an entry's fields hold


class RefusedPickle(pickle.UnpicklingError):
    """The pickle asks for something other than plain values (and so might run code)."""


class PlainUnpickler(pickle.Unpickler):
    """An unpickler that builds plain values only and refuses every global."""

    def find_class(self, module: str, name: str) -> Any:
        raise RefusedPickle(f"it asks for {module}.{name}, which could run code")

    def persistent_load(self, pid: Any) -> Any:
        raise RefusedPickle("it asks for a persistent object, which a dump never holds")


def loads_plain(data: bytes) -> Any:
    """The value a pickle holds, when it holds plain values only (RefusedPickle otherwise)."""
    return PlainUnpickler(io.BytesIO(data)).load()


def sniff(data: bytes) -> Form | None:
    """Which form `data` is in: pickle (protocol 2+ starts with PROTO), JSON (an object), or neither."""
    if data[:1] == b"\x80":
        return "pickle"
    if data.lstrip()[:1] == b"{":
        return "json"
    return None


def decode_dump(data: bytes, where: str) -> tuple[dict[str, Any], Form]:
    """A Flight Recorder dump's dict and its form, or a one-line DumpError naming `where`."""
    form = sniff(data)
    if form is None:
        raise DumpError(f"{where}: not a Flight Recorder dump (neither a pickle nor JSON)")
    if form == "pickle":
        try:
            doc = loads_plain(data)
        except RefusedPickle as e:
            raise DumpError(f"{where}: refused to load this pickle: {e}") from None
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError, KeyError, MemoryError, OverflowError) as e:
            raise DumpError(f"{where}: cannot read the pickle ({type(e).__name__}: {e or 'ends early'}); "
                            "truncated, or not a Flight Recorder dump") from None
    else:
        try:
            doc = json.loads(data.decode("utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as e:
            raise DumpError(f"{where}: not valid JSON ({e}); truncated, or not a Flight Recorder dump") from None
    check_dump(doc, where)
    return doc, form


def check_dump(doc: Any, where: str) -> None:
    """A decoded value is a dump simdist reads: a dict with a 2.x ``version`` and a list of entries."""
    if not isinstance(doc, dict) or "version" not in doc:
        raise DumpError(f"{where}: not a Flight Recorder dump (no 'version' field)")
    v = parse_version(doc["version"])
    if v is None or v[0] != 2:
        raise DumpError(f"{where}: Flight Recorder format version {doc['version']!r} is not one simdist reads "
                        "(it reads 2.x, written by torch 2.2 and later)")
    entries = doc.get("entries", [])
    if not isinstance(entries, list) or not all(isinstance(e, dict) for e in entries):
        raise DumpError(f"{where}: 'entries' is not a list of records")
    for k, e in enumerate(entries):
        missing = [f for f in ("profiling_name", "collective_seq_id") if f not in e]
        if missing:
            raise DumpError(f"{where}: entries[{k}] has no {missing[0]!r}")
        if not isinstance(e["profiling_name"], str) or not isinstance(e["collective_seq_id"], int):
            raise DumpError(f"{where}: entries[{k}]: profiling_name or collective_seq_id has the wrong type")
        bad = next((f for f, v in e.items() if not isinstance(v, _PLAIN)), None)
        if bad is not None:  # a set or bytearray: plain, but never in a dump
            raise DumpError(f"{where}: entries[{k}].{bad} is not a plain value")
