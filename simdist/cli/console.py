"""What every command shares: the consoles, tables, exit codes, one-line errors, output
paths and size parsing.

Exit codes hold for every command: 0 ok (the scenario passed -- see `simdist.expect.judge`;
sim and real agree; the fuzzer's search ended as the template's `[fuzz].expect` says),
1 a check failed (the thing checked did not hold; sim and real differ), 2 bad input or usage (one line naming the
field or option, never a traceback; an output path that cannot be written is bad usage too),
3 a bug in simdist, 4 (`compare`) sim and real differ only by a race of the real run
(`simdist.races`: not a model difference, not agreement either; each race is said), 130
interrupted (Ctrl-C), 141 the output pipe was closed. Several files in one command: the worst
code of any (`SEVERITY`: a race is less than a failed check).

Output is plain when stdout is not a terminal: no box drawing in tables, no wrapping at 80
columns (`PlainWhenPiped`, `show`), so that piped output greps and diffs line by line.

User text (scenario and group names, error messages from torch and Gloo, file names) is
printed verbatim: the consoles have Rich markup switched off, so a Gloo error such as
``[/__w/pytorch/.../pair.cc:553]`` is text, not a closing tag. Colour is added only
through `rich.text.Text` styles (`say`), never by formatting markup into a string.
"""

from __future__ import annotations

import contextlib
import os
import tempfile
from collections.abc import Callable, Iterator
from enum import IntEnum
from pathlib import Path
from typing import Any, NoReturn

import typer
from pydantic import ByteSize, TypeAdapter, ValidationError
from rich.console import Console, ConsoleDimensions
from rich.table import Table
from rich.text import Text

from simdist.errors import InputError, SimdistError


class ExitCode(IntEnum):
    OK = 0
    CHECK_FAILED = 1
    BAD_INPUT = 2
    INTERNAL = 3
    RACE = 4  # compare: every difference is a race of the real run (`simdist.races`), none the model's
    INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
    PIPE_CLOSED = 141  # the reader of our output went away, as shells report SIGPIPE


# worst first: which code a command over several files exits with (`worst`)
SEVERITY = (ExitCode.PIPE_CLOSED, ExitCode.INTERRUPTED, ExitCode.INTERNAL, ExitCode.BAD_INPUT, ExitCode.CHECK_FAILED,
            ExitCode.RACE, ExitCode.OK)

PIPE_WIDTH = 100_000  # "no wrapping": wider than any line simdist prints


class PlainWhenPiped(Console):
    """A Rich console that does not wrap lines at 80 columns when its file is not a terminal
    (Rich's default width for pipes); on a terminal it is Rich's own. The file is looked up
    when printing, so a console made at import time follows a later redirection."""

    @property
    def size(self) -> ConsoleDimensions:
        size = super().size
        return size if self.is_terminal else ConsoleDimensions(PIPE_WIDTH, size.height)

    @size.setter
    def size(self, new_size: tuple[int, int]) -> None:
        Console.size.fset(self, new_size)  # type: ignore[attr-defined]


out = PlainWhenPiped(markup=False, highlight=False)
err = PlainWhenPiped(stderr=True, markup=False, highlight=False)


def table(*columns: str, title: str | None = None, **column_kw: Any) -> Table:
    """A table with these columns (each column gets `column_kw`); print it with `show`."""
    t = Table(title=title)
    for c in columns:
        t.add_column(c, **column_kw)
    return t


def show(t: Table, console: Console = out) -> None:
    """Print a table: with box drawing on a terminal, as plain aligned columns otherwise
    (without the spaces Rich pads each line with to the table's width, so that piped output
    diffs and greps cleanly)."""
    if console.is_terminal:
        console.print(t)
        return
    t.box = None
    t.pad_edge = False
    with console.capture() as captured:
        console.print(t)
    console.out("\n".join(line.rstrip() for line in captured.get().splitlines()), highlight=False)

Part = str | tuple[str, str]  # plain text, or (text, Rich style)


def say(*parts: Part, console: Console = out) -> None:
    """Print one line made of plain and styled parts; no markup, no wrapping of long lines."""
    console.print(Text.assemble(*parts), soft_wrap=True)


def exit_with(code: ExitCode) -> NoReturn:
    raise typer.Exit(int(code))


def exit_on(ok: bool) -> NoReturn:
    """Exit 0 when what was checked holds, else 1."""
    exit_with(ExitCode.OK if ok else ExitCode.CHECK_FAILED)


def say_error(message: str) -> None:
    """"error: LINE" on stderr for each line of `message` (a scenario with several problems
    has one line per problem, each naming its field)."""
    for line in message.splitlines() or [""]:
        say(("error:", "red"), " ", line, console=err)


def fail(message: str, code: int = ExitCode.BAD_INPUT) -> NoReturn:
    """"error: MESSAGE" on stderr (one line per line of it), then exit `code` (default 2, bad input)."""
    say_error(message)
    raise typer.Exit(int(code))


def fail_input(message: str) -> NoReturn:
    """One line naming what is wrong with the input, then exit 2."""
    fail(message, ExitCode.BAD_INPUT)


def worst(codes: list[int]) -> int:
    """The exit code of a command over several files: the worst of theirs by `SEVERITY` (0 when none)."""
    return min(codes, key=lambda c: SEVERITY.index(c) if c in SEVERITY else -1, default=int(ExitCode.OK))


@contextlib.contextmanager
def bad_input(source: object = None) -> Iterator[None]:
    """Inside the block, a `SimdistError` (bad scenario, template, option, host, a resource
    limit met while running) is bad input; `source` (the file) leads the line if it does not."""
    try:
        yield
    except SimdistError as e:
        fail_input(str(e) if source is None else sourced(str(e), source))


def sourced(message: str, source: object) -> str:
    """`message` led by its source (the file), unless it already names it first."""
    return message if message.startswith(f"{source}: ") else f"{source}: {message}"


# nccl-tests' -b/-e convention: a bare K, M, G or T suffix is binary (1M = 2**20 bytes);
# every other unit is pydantic's ByteSize (KiB and MiB binary, KB and MB decimal, ...).
_BINARY_SUFFIX = {"k": "KiB", "m": "MiB", "g": "GiB", "t": "TiB"}
_BYTES = TypeAdapter(ByteSize)


def parse_size(text: str | int, field: str = "bytes") -> int:
    """'1048576', '1M', '1MiB', '64K', '2g', '1.5 GB' -> bytes (a bare K/M/G/T is binary)."""
    if isinstance(text, int):
        v = text
    else:
        raw = str(text).strip()
        if raw and raw[-1].lower() in _BINARY_SUFFIX and raw[:-1].strip().replace(".", "", 1).isdigit():
            raw = raw[:-1].strip() + _BINARY_SUFFIX[raw[-1].lower()]
        try:
            v = int(_BYTES.validate_python(raw))
        except ValidationError:
            raise InputError(f"{field}: cannot read size {text!r} (e.g. 4096, 64K, 1MiB)") from None
    if v < 0:
        raise InputError(f"{field}: must be >= 0")
    return v


# --------------------------------------------------------------------------- output paths
def check_output_file(path: Path | None, option: str) -> None:
    """Before any work: `path` can be written (its folder exists and is writable, it is not a
    folder). Raises InputError naming the option, which the commands turn into exit 2."""
    if path is None:
        return
    if path.is_dir():
        raise InputError(f"{option}: {path} is a folder; give a file name")
    folder = path.parent
    if not folder.exists():
        raise InputError(f"{option}: folder {folder} does not exist (for {path})")
    if not folder.is_dir():
        raise InputError(f"{option}: {folder} is not a folder (for {path})")
    if not os.access(folder, os.W_OK | os.X_OK) or (path.exists() and not os.access(path, os.W_OK)):
        raise InputError(f"{option}: cannot write {path} (permission denied)")


def check_output_folder(path: Path | None, option: str) -> None:
    """Before any work: `path` is a writable folder, or can be made in the nearest existing one."""
    if path is None:
        return
    probe = path
    while not probe.exists() and probe != probe.parent:
        probe = probe.parent
    if not probe.is_dir():
        raise InputError(f"{option}: {probe} is not a folder (for {path})")
    if not os.access(probe, os.W_OK | os.X_OK):
        raise InputError(f"{option}: cannot write in {probe} (permission denied)")
    try:  # access() says yes to root everywhere, /proc and read-only mounts included: try it
        tempfile.TemporaryDirectory(dir=probe, prefix=".simdist-probe-").cleanup()
    except OSError as e:
        raise InputError(f"{option}: cannot write in {probe} ({e.strerror or type(e).__name__})") from None


def write_output(write: Callable[[], Any], path: Path, option: str) -> bool:
    """Write an output file after the work is done: a failure now (disk full, the folder
    removed meanwhile) is one line on stderr and False, so the caller still prints what it
    computed and exits 2 at the end instead of losing the results."""
    try:
        write()
        return True
    except OSError as e:
        say(("error:", "red"), f" {option}: cannot write {path} ({e.strerror or type(e).__name__})", console=err)
        return False
