"""The `simdist` typer app and `main`, which turns whatever a command raises into an exit code.

Commands live in one module per group and are mounted here with `register(app)`:
`scenario` (run, check, real, compare), `fuzz` (fuzz), `timing` (explain, bench,
compare-timing). Exit codes are those of `simdist.cli.console.ExitCode`.
"""

from __future__ import annotations

import os
import sys

import typer

from simdist.cli import fuzz, scenario, timing
from simdist.cli.console import ExitCode, err, say
from simdist.errors import SimdistError

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Simulate, check and replay PyTorch distributed training loops (Join, DDP, ZeRO, uneven inputs).",
    pretty_exceptions_enable=False,
)
scenario.register(app)  # run, real, compare, check
timing.register(app)  # bench, compare-timing, explain
fuzz.register(app)  # fuzz


def main() -> None:
    """Entry point of the `simdist` script and `python -m simdist`."""
    try:
        app()
    except SimdistError as e:  # bad input that a command did not catch itself
        say(("error:", "red"), f" {e}", console=err)
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
