"""The simdist side of the fork server: start a zygote, have it fork rank processes.

A run through a zygote (`run_script(..., zygote=z)`) starts each rank by a fork of a
process that has torch and the rank layer imported already (`simdist.script.rank.zygote`)
instead of a fresh interpreter: tens of milliseconds instead of 1-2 s per rank. The
fuzzer runs every schedule of a script this way; one-off runs keep the plain launch.

A zygote made for one script preloads that script's torch/NumPy imports too (the fuzzer's,
which runs one script many times); one made for no script (`Zygote(None)`) preloads only
the common ones and runs any script of its mode (a test session's many short runs). The
ranks' stdout and stderr are the zygote's, chosen when it starts; everything else
(environment, arguments, working directory, run id, `--batches` caps) is the run's own. What every fork
server does (the forked processes as the launcher sees them, sessions, exit statuses) is
`simdist.forkserver`'s; the zygote's own processes carry its run id, and `close` ends them.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import IO

from simdist.errors import ScriptError
from simdist.forkserver import ForkedProcess, ForkServer
from simdist.script import env, launch


class Zygote(ForkServer):
    """A fork server for one mode and simulated GPU count, and for one script (its imports
    preloaded) or, with `script=None`, for any script."""

    def __init__(self, script: str | os.PathLike | None, *, mode: str = env.SIM, gpus: int = 8,
                 stdout: int | IO | None = None, stderr: int | IO | None = None):
        self.script, self.mode, self.gpus = None if script is None else str(script), mode, gpus
        self.run_id = launch.new_run_id()
        e = launch.base_env("-", self.run_id, gpus, mode)  # rank layer on; each rank gets its run's socket
        self._own = launch.Launch(self.run_id)  # the zygote and, through the run id, what it forked
        try:
            super().__init__("simdist.script.rank.zygote", [] if script is None else [self.script], env=e, owner=self._own.procs,
                             stdout=stdout, stderr=stderr)
        except OSError:
            raise ScriptError(f"script: the fork server for {script or 'scripts'} did not start") from None

    def spawn(self, starts: list[tuple[dict[str, str], list[str]]]) -> list[ForkedProcess]:
        """Fork, for each (environment, argv), a rank that runs `python ARGV` with that
        environment, in our working directory (where a launched rank would start); all
        requested at once (`fork_all`)."""
        if any(e.get(env.MODE) != self.mode or e.get(env.GPUS) != str(self.gpus) for e, _ in starts):
            raise ScriptError("script: a run's mode and GPU count must be the fork server's")
        try:
            cwd = os.getcwd()
        except OSError:  # ours was removed: the rank keeps the zygote's (a launched one would inherit the removed one)
            cwd = None
        return self.fork_all([{"env": e, "argv": argv, "cwd": cwd} for e, argv in starts])

    def _end(self) -> None:
        launch.end(self._own)

    def __enter__(self) -> Zygote:
        return self


def runs(zygote: Zygote, script: Path, mode: str) -> bool:
    """Whether `zygote` can run `script` in `mode` (one made for no script runs any)."""
    return zygote.mode == mode and (zygote.script is None or Path(zygote.script).resolve() == script.resolve())
