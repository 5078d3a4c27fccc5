"""The `simdist` command line: one module per command group, mounted on one typer app.

* `app` -- the typer app and `main` (exceptions -> exit codes);
* `console` -- what every command shares: consoles without markup, exit codes, one-line
  errors, size parsing;
* `scenario` -- run, check, real, compare (one scenario file);
* `fuzz` -- fuzz (templates);
* `timing` -- explain, bench, compare-timing (the cost model).

Apart from the shared report types, this package (and the lazy `simdist.run_real`) is the
only place where `simdist` and `real_backend` meet.
"""

from simdist.cli.app import app, main

__all__ = ["app", "main"]
