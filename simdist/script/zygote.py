"""The simdist side of the fork server: start a zygote, have it fork rank processes.

A run through a zygote (`run_script(..., zygote=z)`) starts each rank by a fork of a
process that has torch and the rank layer imported already (`simdist.script.rank.zygote`)
instead of a fresh interpreter: tens of milliseconds instead of 1-2 s per rank. The
fuzzer runs every schedule of a script this way; one-off runs keep the plain launch.

The ranks' stdout and stderr are the zygote's, chosen when it starts; everything else
(environment, arguments, run id, `--batches` caps) is the run's own. `ForkedProcess` gives
the launcher the part of `subprocess.Popen` it uses (pid, poll, wait, returncode): the
zygote is the ranks' parent, so it reaps them and reports each exit status. Every forked
rank leads its own session, so the launcher ends it and all it started with `killpg` as
for a launched rank; the zygote's own processes carry its run id, and `close` ends them.
"""

from __future__ import annotations

import os
import selectors
import socket
import subprocess
import sys
import time
from pathlib import Path
from typing import IO, Any

from simdist.errors import ScriptError
from simdist.script import env, launch, wire

START_TIMEOUT_S = 120.0


class ForkedProcess:
    """A rank process the zygote forked, seen through the zygote's reports."""

    def __init__(self, zygote: Zygote, pid: int):
        self.zygote = zygote
        self.pid = pid
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.zygote.pump(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            self.zygote.pump(left)
        return self.returncode


class Zygote:
    """A fork server for one script (its imports preloaded), mode and simulated GPU count."""

    def __init__(self, script: str | os.PathLike, *, mode: str = env.SIM, gpus: int = 8,
                 stdout: int | IO | None = None, stderr: int | IO | None = None):
        self.script, self.mode, self.gpus = str(script), mode, gpus
        self.run_id = launch.new_run_id()
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}  # exits reported before `spawn` saw the fork's reply
        self._sock, theirs = socket.socketpair()
        e = launch.base_env("-", self.run_id, gpus, mode)  # rank layer on; each rank gets its run's socket
        self._own = launch.Launch(self.run_id)  # the zygote and, through the run id, what it forked
        try:
            self.proc = self._own.procs.start(
                [sys.executable, "-m", "simdist.script.rank.zygote", self.script, str(theirs.fileno())], env=e,
                pass_fds=(theirs.fileno(),), stdout=stdout, stderr=stderr)
        finally:
            theirs.close()
        self._sel = selectors.DefaultSelector()
        self._sel.register(self._sock, selectors.EVENT_READ)
        self._decoder = wire.Decoder()
        self._replies: list[dict[str, Any]] = []
        if self._next_reply(START_TIMEOUT_S).get("ready") is None:
            self.close()
            raise ScriptError(f"script: the fork server for {script} did not start")

    def pump(self, timeout: float | None) -> None:
        """Read what the zygote reported (exits, replies), waiting up to `timeout` seconds."""
        if not self._sel.select(timeout):
            return
        try:
            data = self._sock.recv(1 << 16)
        except OSError:
            data = b""
        if not data:
            self._lost()
            return
        for header, _ in self._decoder.feed(data):
            if "status" in header:
                child = self._children.pop(int(header["pid"]), None)
                if child is not None:
                    child.returncode = int(header["status"])
                else:
                    self._early[int(header["pid"])] = int(header["status"])
            else:
                self._replies.append(header)

    def _lost(self) -> None:
        """The zygote is gone: its children died with it (PR_SET_PDEATHSIG)."""
        for child in self._children.values():
            child.returncode = -9
        self._children.clear()
        self._replies.append({})

    def _next_reply(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        while not self._replies and time.monotonic() < deadline:
            self.pump(deadline - time.monotonic())
        return self._replies.pop(0) if self._replies else {}

    def spawn(self, environ: dict[str, str], argv: list[str]) -> ForkedProcess:
        """Fork a rank that runs `python ARGV` with environment `environ`."""
        if environ.get(env.MODE) != self.mode or environ.get(env.GPUS) != str(self.gpus):
            raise ScriptError("script: a run's mode and GPU count must be the fork server's")
        wire.send(self._sock, {"env": environ, "argv": argv})
        pid = self._next_reply(START_TIMEOUT_S).get("forked")
        if pid is None:
            raise OSError("the fork server did not fork")
        child = ForkedProcess(self, int(pid))
        child.returncode = self._early.pop(child.pid, None)
        if child.returncode is None:
            self._children[child.pid] = child
        return child

    def close(self) -> None:
        """End the zygote and everything it forked."""
        try:
            self._sock.close()
        finally:
            self._sel.close()
            launch.end(self._own)

    def __enter__(self) -> Zygote:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


def same_script(zygote: Zygote, script: Path) -> bool:
    return Path(zygote.script).resolve() == script.resolve()
