"""The `simdist` command line: one module per command group, sharing `app`.

`app.py` holds the typer app and the scenario commands (run, real, compare), `fuzz.py`
the fuzzer and checker commands, `timing.py` the cost-model commands. This package is
the only place where `simdist` and `real_backend` meet.
"""

from simdist.cli.app import app, main

__all__ = ["app", "main"]
