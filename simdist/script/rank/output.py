"""The script's printed lines, per rank: sys.stdout and sys.stderr tee to the coordinator.

Writes go to the real stream as before (the user sees the script's output as usual) and
each complete line is also sent to the coordinator tagged with the stream, so reports can
show and compare what every rank printed. Lines printed before the process knows its rank
(before `init_process_group`) are held and sent once it registers.
"""

from __future__ import annotations

import sys
import threading
from typing import Any

from simdist.script.rank import client

_MAX_PENDING = 2000
_pending: list[tuple[str, str]] = []
_lock = threading.Lock()


def _emit(stream: str, line: str) -> None:
    c = client.CLIENT
    if c is not None and c.rank is not None:
        c.send_line(stream, line)
    elif len(_pending) < _MAX_PENDING:
        _pending.append((stream, line))


class Tee:
    """A text stream that writes through to `stream` and reports whole lines."""

    def __init__(self, stream: Any, name: str):
        self._stream = stream
        self._name = name
        self._partial = ""

    def write(self, s: str) -> int:
        n = self._stream.write(s)
        with _lock:
            text = self._partial + s
            *lines, self._partial = text.split("\n")
            for line in lines:
                _emit(self._name, line)
        return n

    def writelines(self, lines: Any) -> None:
        for line in lines:
            self.write(line)

    def flush(self) -> None:
        self._stream.flush()

    def flush_partial(self) -> None:
        with _lock:
            if self._partial:
                _emit(self._name, self._partial)
                self._partial = ""

    def __getattr__(self, name: str) -> Any:  # fileno, isatty, encoding, buffer, ...
        return getattr(self._stream, name)


def install() -> None:
    if not isinstance(sys.stdout, Tee) and sys.stdout is not None:
        sys.stdout = Tee(sys.stdout, "stdout")
    if not isinstance(sys.stderr, Tee) and sys.stderr is not None:
        sys.stderr = Tee(sys.stderr, "stderr")


def registered() -> None:
    """The process is a rank now: send the lines it printed before."""
    with _lock:
        held = list(_pending)
        _pending.clear()
    for stream, line in held:
        _emit(stream, line)


def flush() -> None:
    """At exit: a last line without a newline is a line too."""
    for s in (sys.stdout, sys.stderr):
        if isinstance(s, Tee):
            s.flush_partial()


def forget_after_fork() -> None:
    _pending.clear()
