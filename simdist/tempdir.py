"""A temporary folder that is removed even when its owner is SIGKILLed.

A run's ranks write their records into a folder the launcher reads afterwards; should the
launcher die first (SIGKILL included), nothing is left behind: a small reaper process,
started with the folder, removes it once its owner is gone, after the processes it was told
about have ended too (they may still write there while they stop). Used by the real
backend (`real_backend.launch`); beside `simdist.procs`, which starts and ends the ranks.
"""

from __future__ import annotations

import contextlib
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path

from simdist.procs import REAP_WAIT_S

# The reaper: reads its owner's instructions until EOF (the owner closed the pipe, or died),
# then, unless told to keep the folder, waits for the processes it was told about (at most
# REAPER_WAIT_S) and removes the folder. It leads its own session, so Ctrl-C in a terminal
# does not end it before its owner has said whether to keep the folder.
REAPER_WAIT_S = 30.0
_REAPER = """
import os, shutil, sys, time
path, wait_s = sys.argv[1], float(sys.argv[2])
keep, pids = False, []
for line in sys.stdin:
    word = line.strip()
    if word == "keep":
        keep = True
    elif word.isdigit():
        pids.append(int(word))
if not keep:
    def alive(pid):  # a zombie (ended, not yet reaped by whoever adopted it) is gone
        try:
            with open(f"/proc/{pid}/stat") as f:
                return f.read().rsplit(")", 1)[1].split()[0] != "Z"
        except OSError:
            pass
        try:
            os.kill(pid, 0)
        except ProcessLookupError:
            return False
        except PermissionError:
            return True
        return not os.path.isdir("/proc")
    deadline = time.monotonic() + wait_s
    while any(alive(p) for p in pids) and time.monotonic() < deadline:
        time.sleep(0.05)
    shutil.rmtree(path, ignore_errors=True)
"""


class TempDir:
    """A folder under the system's temporary directory that is removed when `close()` is
    called, or, should its owner die first (even by SIGKILL), by its reaper process; `keep()`
    leaves it in place, `watch(pid)` makes the reaper wait for that process to end first."""

    def __init__(self, prefix: str):
        self.path = Path(tempfile.mkdtemp(prefix=prefix))
        self._keep = False
        try:
            self._reaper = subprocess.Popen([sys.executable, "-I", "-S", "-c", _REAPER, str(self.path),
                                             str(REAPER_WAIT_S)], stdin=subprocess.PIPE, text=True,
                                            start_new_session=True, close_fds=True)
        except OSError:
            shutil.rmtree(self.path, ignore_errors=True)
            raise

    def _tell(self, line: str) -> None:
        with contextlib.suppress(OSError, ValueError):
            assert self._reaper.stdin is not None
            self._reaper.stdin.write(line + "\n")
            self._reaper.stdin.flush()

    def watch(self, pid: int) -> None:
        self._tell(str(pid))

    def keep(self) -> None:
        self._keep = True
        self._tell("keep")

    def close(self) -> None:
        """Remove the folder (unless kept) and end the reaper."""
        if not self._keep:
            shutil.rmtree(self.path, ignore_errors=True)
        if self._reaper.stdin is not None:
            with contextlib.suppress(OSError):
                self._reaper.stdin.close()
        try:
            self._reaper.wait(timeout=REAP_WAIT_S)
        except subprocess.TimeoutExpired:  # pragma: no cover - it only waits on what we already reaped
            self._reaper.kill()
            self._reaper.wait()

    def __enter__(self) -> TempDir:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
