"""The `simdist` typer app and `main`, which turns whatever a command raises into an exit code.

Commands live in one module per group and are mounted here with `register(app)`:
`scenario` (run, check, real, compare), `fuzz` (fuzz), `timing` (explain, bench,
compare-timing), `flightrec` (diagnose, export: the c10d Flight Recorder's dumps). Exit codes are those of `simdist.cli.console.ExitCode`.
"""

from __future__ import annotations

import os
import sys
from typing import Annotated

import typer

from simdist import __version__
from simdist.cli import flightrec, fuzz, scenario, timing
from simdist.cli.console import ExitCode, err, say, say_error
from simdist.errors import SimdistError

app = typer.Typer(
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
    output paths), 3 a bug in simdist.
    """


scenario.register(app)  # run, real, compare, check, schema
timing.register(app)  # bench, compare-timing, explain
fuzz.register(app)  # fuzz
flightrec.register(app)  # diagnose, export


def main() -> None:
    """Entry point of the `simdist` script and `python -m simdist`."""
    try:
        app()
    except SimdistError as e:  # bad input that a command did not catch itself
        say_error(str(e))
        sys.exit(int(ExitCode.BAD_INPUT))
    except KeyboardInterrupt:
        say("interrupted", console=err)
        sys.exit(int(ExitCode.INTERRUPTED))
    except Exception as e:  # a bug in simdist, not bad input: one line unless debugging
        if os.environ.get("SIMDIST_DEBUG"):
            raise
        say(("internal error:", "red"), f" {type(e).__name__}: {e} (SIMDIST_DEBUG=1 shows the traceback)",
            console=err)
        sys.exit(int(ExitCode.INTERNAL))


if __name__ == "__main__":
    main()
