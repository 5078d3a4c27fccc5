"""`python -m simdist` and the `simdist` script: the command line (`simdist.cli`).

The CLI is imported inside `main`, not when this module is: the import takes seconds on a
busy host (typer, rich, pydantic, scipy), and Ctrl-C during it must end as Ctrl-C later
does, with "interrupted" and exit 130, not a traceback.
"""

import os
import sys


def main() -> None:
    """Entry point: `simdist.cli.main`, once imported."""
    try:
        from simdist.cli import main as cli_main
    except KeyboardInterrupt:
        sys.stderr.write("interrupted\n")
        sys.stderr.flush()
        # Not sys.exit: CPython 3.11 notes an interrupt that lands inside exec() of a string
        # (numpy and scipy import through one) as unhandled even once caught, and then ends
        # the process by SIGINT instead of the code asked for. Nothing is set up yet to clean.
        os._exit(130)  # ExitCode.INTERRUPTED: its module was being imported
    cli_main()


if __name__ == "__main__":
    main()
