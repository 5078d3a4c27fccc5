"""What every command shares: the consoles, exit codes, one-line errors, size parsing.

Exit codes hold for every command: 0 ok (the run completed or met its `[expect]`; sim and
real agree; the fuzzer found nothing), 1 a check failed (the thing checked did not hold),
2 bad input or usage (one line naming the field, never a traceback), 3 a bug in simdist,
130 interrupted (Ctrl-C), 141 the output pipe was closed.

User text (scenario and group names, error messages from torch and Gloo, file names) is
printed verbatim: the consoles have Rich markup switched off, so a Gloo error such as
``[/__w/pytorch/.../pair.cc:553]`` is text, not a closing tag. Colour is added only
through `rich.text.Text` styles (`say`), never by formatting markup into a string.
"""

from __future__ import annotations

import contextlib
import re
from collections.abc import Iterator
from enum import IntEnum
from typing import NoReturn

import typer
from rich.console import Console
from rich.text import Text

from simdist.errors import InputError, SimdistError


class ExitCode(IntEnum):
    OK = 0
    CHECK_FAILED = 1
    BAD_INPUT = 2
    INTERNAL = 3
    INTERRUPTED = 130  # Ctrl-C, as shells report SIGINT
    PIPE_CLOSED = 141  # the reader of our output went away, as shells report SIGPIPE


out = Console(markup=False, highlight=False)
err = Console(stderr=True, markup=False, highlight=False)

Part = str | tuple[str, str]  # plain text, or (text, Rich style)


def say(*parts: Part, console: Console = out) -> None:
    """Print one line made of plain and styled parts; no markup, no wrapping of long lines."""
    console.print(Text.assemble(*parts), soft_wrap=True)


def exit_with(code: ExitCode) -> NoReturn:
    raise typer.Exit(int(code))


def exit_on(ok: bool) -> NoReturn:
    """Exit 0 when what was checked holds, else 1."""
    exit_with(ExitCode.OK if ok else ExitCode.CHECK_FAILED)


def fail(message: str, code: int = ExitCode.BAD_INPUT) -> NoReturn:
    """One line "error: MESSAGE" on stderr, then exit `code` (default 2, bad input)."""
    say(("error:", "red"), " ", message, console=err)
    raise typer.Exit(int(code))


def fail_input(message: str) -> NoReturn:
    """One line naming what is wrong with the input, then exit 2."""
    fail(message, ExitCode.BAD_INPUT)


@contextlib.contextmanager
def bad_input(source: object = None) -> Iterator[None]:
    """Inside the block, a `SimdistError` (bad scenario, template, option, host, a resource
    limit met while running) is bad input; `source` (the file) leads the line if it does not."""
    try:
        yield
    except SimdistError as e:
        msg = str(e)
        if source is not None and not msg.startswith(f"{source}: "):
            msg = f"{source}: {msg}"
        fail_input(msg)


_SIZE = re.compile(r"^\s*(\d+(?:\.\d+)?)\s*([kmgt]?)(i?b?)\s*$", re.IGNORECASE)


def parse_size(text: str | int, field: str = "bytes") -> int:
    """'1048576', '1M', '1MiB', '64KiB', '2g' -> bytes (binary multiples)."""
    if isinstance(text, int):
        v = text
    else:
        m = _SIZE.match(str(text))
        if not m:
            raise InputError(f"{field}: cannot read size {text!r} (e.g. 4096, 64K, 1MiB)")
        mult = {"": 1, "k": 1 << 10, "m": 1 << 20, "g": 1 << 30, "t": 1 << 40}[m.group(2).lower()]
        v = int(float(m.group(1)) * mult)
    if v < 0:
        raise InputError(f"{field}: must be >= 0")
    return v
