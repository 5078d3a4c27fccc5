"""Python frames at a call, and which of them are the user's own code.

A frame is the user's when its file lies outside the interpreter's library directories
(standard library, site-packages: torch and every installed package) and outside simdist
itself. Origins are classified on the coordinator from these frames (`simdist.frames`);
the innermost user frame is where the user's code stands (a blocked call, an exit).
"""

from __future__ import annotations

import functools
import os
import sys
import sysconfig
from types import FrameType

# [file, line, function, is_user]: the JSON form of one frame, innermost first
RawFrame = list

_MAX_DEPTH = 64


def _library_dirs() -> tuple[str, ...]:
    paths = sysconfig.get_paths()
    dirs = {paths[k] for k in ("stdlib", "platstdlib", "purelib", "platlib") if k in paths}
    here = os.path.dirname(os.path.abspath(__file__))
    simdist_dir = os.path.dirname(os.path.dirname(here))
    dirs |= {simdist_dir, os.path.join(os.path.dirname(simdist_dir), "real_backend")}
    return tuple(os.path.join(d, "") for d in dirs if d)


_LIBRARY_DIRS = _library_dirs()


@functools.cache
def is_user_file(filename: str) -> bool:
    if not filename or filename.startswith("<"):
        return False
    return not os.path.abspath(filename).startswith(_LIBRARY_DIRS)


def capture(frame: FrameType | None) -> list[RawFrame]:
    """The stack from `frame` outwards (innermost first), as JSON-ready raw frames."""
    out: list[RawFrame] = []
    while frame is not None and len(out) < _MAX_DEPTH:
        code = frame.f_code
        out.append([code.co_filename, frame.f_lineno, code.co_name, is_user_file(code.co_filename)])
        frame = frame.f_back
    return out


def caller_stack(skip: int = 1) -> list[RawFrame]:
    """The stack of whoever called the function that calls this (skipping `skip` frames)."""
    return capture(sys._getframe(skip + 1))


def innermost_user(frame: FrameType | None) -> FrameType | None:
    while frame is not None:
        if is_user_file(frame.f_code.co_filename):
            return frame
        frame = frame.f_back
    return None


def where(frame: FrameType | None) -> RawFrame | None:
    """[file, line, function] of a frame (for a finished frame: the last line it ran)."""
    if frame is None:
        return None
    return [frame.f_code.co_filename, frame.f_lineno, frame.f_code.co_name]


def traceback_user_frame(tb) -> RawFrame | None:  # type: ignore[no-untyped-def]
    """The innermost frame of a traceback that is the user's code, as [file, line, function]."""
    best = None
    while tb is not None:
        code = tb.tb_frame.f_code
        if is_user_file(code.co_filename):
            best = [code.co_filename, tb.tb_lineno, code.co_name]
        tb = tb.tb_next
    return best
