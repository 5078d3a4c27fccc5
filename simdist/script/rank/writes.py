"""Which files a process of the run wrote: every path it opens for writing, creates, renames,
truncates or deletes is listed in the run's folder (`env.WRITES`).

Why: `simdist compare` runs its two sides one after the other in the same working directory
and puts back, before the second side, what the first one changed (a checkpoint the script
resumes from, a log it appends to: `simdist.script.workdir`). Told only by a listing of the
directory, it put back whatever had changed there while the first side ran, files other
processes wrote included (two helpers lost their own logs that way). With this list it sets
aside only what the run's processes wrote.

How: the Python-level calls every file write goes through are wrapped: `open` (`builtins`
and `io`: `pathlib`, `shutil.copy*`, `numpy.save`, `pickle.dump(open(...))`), `os.open`
(`tempfile`, `Path.touch`), `os.rename`/`replace`/`remove`/`unlink`/`rmdir`/`mkdir`
(`os.makedirs`, `shutil.move`; a folder only when `mkdir` made it), `os.symlink`/`link`
(`Path.symlink_to`), `os.utime` (`Path.touch` of a file that exists), `os.mkfifo`/`mknod`,
`os.truncate`, `shutil.rmtree`, and torch's zip writer
(`torch.save` to a file name opens it in C++), and `torch.jit.save`'s. A write from C code that does not go through
them (safetensors' Rust writer, sqlite, a subprocess the script starts) is not listed: such a
file is left where it is, and the report names it as changed by something else.
Each process lists a path once; a forked child (DataLoader workers) inherits the wrappers.
"""

from __future__ import annotations

import builtins
import functools
import io
import os
import shutil
from collections.abc import Callable
from typing import Any

from simdist.script import env

_WRITE_FLAGS = os.O_WRONLY | os.O_RDWR | os.O_CREAT | os.O_TRUNC | os.O_APPEND
_os_open, _os_write, _os_close = os.open, os.write, os.close  # (the originals: recording never records)
_seen: set[str] = set()


def _resolve(path: Any, dir_fd: int | None = None) -> str | None:
    """`path`'s absolute name (None: a file descriptor, or nothing to name)."""
    if isinstance(path, int) or path is None:
        return None
    try:
        name = os.fsdecode(path)
    except TypeError:
        return None
    if dir_fd is not None and not os.path.isabs(name):
        try:
            return os.path.join(os.readlink(f"/proc/self/fd/{dir_fd}"), name)
        except OSError:
            return None
    return os.path.abspath(name)


def record(path: Any, dir_fd: int | None = None) -> None:
    """`path` was written by this process: listed in its `env.WRITES` file (once)."""
    name = _resolve(path, dir_fd)
    if name is None or name in _seen:
        return
    listing = env.writes_file()
    if listing is None:
        return
    _seen.add(name)
    try:
        fd = _os_open(listing, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        try:
            _os_write(fd, os.fsencode(name) + b"\n")
        finally:
            _os_close(fd)
    except OSError:
        pass


def _writes(mode: Any) -> bool:
    return not isinstance(mode, str) or any(c in mode for c in "wax+")


def _wrap(owner: Any, name: str, paths: Callable[..., list[tuple[Any, Any]]], made: bool = False) -> None:
    """`owner.name` records the paths `paths(*args, **kwargs)` names ((path, dir_fd) pairs)
    before it runs (a call that fails after creating a file still created it). `made`: only
    once it returned, for a call that changes nothing when it fails (`os.mkdir` of a folder
    that exists, as `os.makedirs(..., exist_ok=True)` and `Path.mkdir(exist_ok=True)` call
    it: a folder the side wrote claims every change below it, another process's too)."""
    orig = getattr(owner, name)

    @functools.wraps(orig)
    def call(*args: Any, **kwargs: Any) -> Any:
        named = paths(*args, **kwargs)
        if not made:
            for path, dir_fd in named:
                record(path, dir_fd)
        out = orig(*args, **kwargs)
        for path, dir_fd in named if made else ():
            record(path, dir_fd)
        return out

    # A staticmethod (callable since Python 3.10), not the bare function: the original is a
    # builtin, which never binds, so a class attribute `opener = open` called as
    # `self.opener(path, "w")` passes no `self`; a plain function there got the instance as
    # its path (TypeError: 'str' object cannot be interpreted as an integer, on the simulated
    # side only).
    setattr(owner, name, staticmethod(call))


def _open_paths(file: Any, mode: Any = "r", *args: Any, **kwargs: Any) -> list:
    return [(file, None)] if _writes(kwargs.get("mode", mode)) else []


def _os_open_paths(path: Any, flags: int, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> list:
    return [(path, dir_fd)] if flags & _WRITE_FLAGS else []


def _one(path: Any, *args: Any, dir_fd: int | None = None, **kwargs: Any) -> list:
    return [(path, dir_fd)]


def _two(src: Any, dst: Any, *args: Any, src_dir_fd: int | None = None, dst_dir_fd: int | None = None,
         **kwargs: Any) -> list:
    return [(src, src_dir_fd), (dst, dst_dir_fd)]


def _link_paths(src: Any, dst: Any, *args: Any, dir_fd: int | None = None, dst_dir_fd: int | None = None,
                **kwargs: Any) -> list:
    """`os.symlink(src, dst, dir_fd=)` and `os.link(src, dst, dst_dir_fd=)` create `dst` only."""
    return [(dst, dir_fd if dir_fd is not None else dst_dir_fd)]


def _forget_after_fork() -> None:
    """A forked child lists what it writes in its own file (its pid's), from scratch."""
    _seen.clear()


def install() -> None:
    """The wrappers (module docstring); once per process, before the script runs."""
    _wrap(builtins, "open", _open_paths)
    io.open = builtins.open  # (the same function, under both names)
    _wrap(os, "open", _os_open_paths)
    for name in ("remove", "unlink", "rmdir", "truncate", "utime", "mkfifo", "mknod"):
        _wrap(os, name, _one)
    _wrap(os, "mkdir", _one, made=True)
    for name in ("rename", "replace"):
        _wrap(os, name, _two)
    for name in ("symlink", "link"):  # (`Path.symlink_to`, `hardlink_to`: a "latest" link to a checkpoint)
        _wrap(os, name, _link_paths)
    _wrap(shutil, "rmtree", _one)  # (it deletes below through descriptors: `dir_fd` names)
    os.register_at_fork(after_in_child=_forget_after_fork)


def install_torch(serialization: Any) -> None:
    """`torch.save(obj, name)` opens `name` in C++ (`torch.serialization._open_zipfile_writer_file`)."""
    cls = serialization._open_zipfile_writer_file
    orig = cls.__init__

    @functools.wraps(orig)
    def __init__(self: Any, name: Any, *args: Any, **kwargs: Any) -> None:
        record(name)
        orig(self, name, *args, **kwargs)

    cls.__init__ = __init__


def install_jit(script: Any) -> None:
    """`torch.jit.save(m, name)` and `m.save(name)` write `name` in C++ (`torch.jit._script`)."""
    cls = script.RecursiveScriptModule
    orig = cls.save

    @functools.wraps(orig)
    def save(self: Any, f: Any, *args: Any, **kwargs: Any) -> Any:
        record(f)
        return orig(self, f, *args, **kwargs)

    cls.save = save
