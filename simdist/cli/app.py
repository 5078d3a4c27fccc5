"""The `simdist` typer app and `main`, which turns whatever a command raises into an exit code.

Commands live in one module per group and are mounted here with `register(app)`:
`scenario` (run, check, real, compare), `fuzz` (fuzz), `timing` (explain, bench,
compare-timing), `flightrec` (diagnose, export: the c10d Flight Recorder's dumps). Exit codes are those of `simdist.cli.console.ExitCode`.
"""

from __future__ import annotations

import contextlib
import os
import sys
from typing import Annotated, Any, NoReturn

import typer
from typer.core import TyperGroup

from simdist import __version__
from simdist.cli import flightrec, fuzz, scenario, timing
from simdist.cli.console import ExitCode, err, say, say_error
from simdist.errors import SimdistError


class _Commands(TyperGroup):
    """typer's command group, except for what typer would end with exit 1 itself (1 means
    "a check failed"): an EOFError ("Aborted!") is a bug, a closed output pipe is not a
    failed check; both go on to `main`. Ctrl-C says so before typer exits 130."""

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except KeyboardInterrupt:
            say("interrupted", console=err)
            raise
        except BrokenPipeError:
            raise _PipeClosed from None
        except EOFError as e:
            raise _Escaped(e) from e


class _PipeClosed(Exception):
    """Whoever read our output stopped reading (`simdist run --json x | head`)."""


class _Escaped(Exception):
    """An exception typer would have swallowed, carried to `main`."""


app = typer.Typer(
    cls=_Commands,
    add_completion=True,  # typer's --install-completion / --show-completion (bash, zsh, fish, PowerShell)
    no_args_is_help=True,
    pretty_exceptions_enable=False,
    # Help text is plain text: Rich markup would eat "[fuzz]" and "[expect]" (as it eats user text).
    rich_markup_mode=None,
    context_settings={"help_option_names": ["-h", "--help"]},
)


def _version(value: bool) -> None:
    if value:
        say(f"simdist {__version__}")
        raise typer.Exit()


@app.callback()
def _root(
    version: Annotated[bool, typer.Option("--version", callback=_version, is_eager=True,
                                          help="print simdist's version and exit")] = False,
) -> None:
    """Simulate, check and replay PyTorch distributed training loops (Join, DDP, ZeRO, uneven inputs).

    Exit codes, for every command: 0 ok, 1 a check failed, 2 bad input or usage (including
    output paths), 3 a bug in simdist, 4 (compare) sim and real differ only by a race of the
    real run, 130 interrupted, 141 the output pipe was closed.
    """


scenario.register(app)  # run, real, compare, check, schema
timing.register(app)  # bench, compare-timing, explain
fuzz.register(app)  # fuzz
flightrec.register(app)  # diagnose, export

REPORT_BUGS = ("this is a bug in simdist, not in your input: please report it to the simdist maintainers with the "
               "command line and its input files (SIMDIST_DEBUG=1 shows the traceback)")


def main() -> None:
    """Entry point of the `simdist` script and `python -m simdist`.

    Exit codes (`ExitCode`): 0 ok, 1 a check failed, 2 bad input, 3 a bug in simdist (one
    line saying so and where to report it; never a traceback unless SIMDIST_DEBUG=1),
    4 (`compare`) a race of the real run only, 130 interrupted, 141 the output pipe was closed."""
    try:
        app()
    except SystemExit as e:
        if e.code == int(ExitCode.INTERRUPTED):  # typer's exit after Ctrl-C (said already)
            _exit_interrupted()
        raise
    except SimdistError as e:  # bad input that a command did not catch itself
        say_error(str(e))
        sys.exit(int(ExitCode.BAD_INPUT))
    except KeyboardInterrupt:
        say("interrupted", console=err)
        _exit_interrupted()
    except _PipeClosed:
        with contextlib.suppress(OSError):  # nothing more reaches the reader, not even at exit
            os.dup2(os.open(os.devnull, os.O_WRONLY), sys.stdout.fileno())
        sys.exit(int(ExitCode.PIPE_CLOSED))
    except Exception as e:  # a bug in simdist, not bad input: one line unless debugging
        if os.environ.get("SIMDIST_DEBUG"):
            raise
        _internal_error(e.__cause__ if isinstance(e, _Escaped) and e.__cause__ is not None else e)


def _exit_interrupted() -> NoReturn:
    """Exit 130 now, output flushed. Not sys.exit: CPython 3.11 marks a Ctrl-C that landed
    inside exec() of a string (dataclasses and numpy run one while modules load, also the
    ones a command loads late) as unhandled even once caught, and then ends the process by
    SIGINT instead of the code asked for. Every `with` and `finally` has run by now, and
    simdist registers nothing to run at exit."""
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):  # a closed pipe
            stream.flush()
    os._exit(int(ExitCode.INTERRUPTED))


def _internal_error(e: BaseException) -> NoReturn:
    """One line on stderr and exit 3, even when printing itself fails (out of memory)."""
    text = str(e).strip().splitlines()[0] if str(e).strip() else ""
    if len(text) > 200:
        text = text[:197] + "..."
    what = f"{type(e).__name__}{': ' + text if text else ''}"
    if isinstance(e, MemoryError):
        what = "out of memory (if a SIMDIST_MAX_* limit was raised, this machine cannot take that much)"
    line = f"internal error: {what} -- {REPORT_BUGS}"
    try:
        say(("internal error:", "red"), line[len("internal error:"):], console=err)
    except BaseException:  # noqa: BLE001 - the console failed too (MemoryError): raw bytes
        with contextlib.suppress(OSError):
            os.write(2, (line + "\n").encode(errors="replace"))
    sys.exit(int(ExitCode.INTERNAL))


if __name__ == "__main__":
    main()
