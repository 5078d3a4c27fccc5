"""How a rank process ends, and where the user's code stood when it did.

The coordinator learns that a rank ended when its connection closes; this module tells it
how first: an exception (with the innermost user frame of its traceback), `sys.exit` or
`os._exit` (with the user line that called it), or a normal return. For a normal return,
"where it left" is the last line the user's entry function ran: the outermost user frame
that was on the stack when the rank called `init_process_group` (e.g. the `worker` that
`mp.spawn` called); a finished frame still knows its last line.

Exceptions are seen wherever they end a rank: `sys.excepthook` (a script run directly),
`torch.multiprocessing.spawn`'s wrapper (it catches the exception, then calls `sys.exit(1)`
inside its handler, where `sys.exc_info()` still holds it), and `multiprocessing.Process.run`.
"""

from __future__ import annotations

import _io
import atexit
import builtins
import contextlib
import gc
import io
import os
import sys
import threading
import time
from collections.abc import Callable
from types import FrameType
from typing import Any

from simdist.script import env
from simdist.script.rank import client, output, stack

_info: dict[str, Any] = {}
_FILE_BASES = frozenset({_io._IOBase, io.IOBase})  # what a file's class derives from
_entry: list[FrameType] = []
_extras: list[Callable[[], dict[str, Any]]] = []  # more to say at exit (the Flight Recorder)


def add_to_exit(fn: Callable[[], dict[str, Any]]) -> None:
    _extras.append(fn)


def registered(caller: FrameType | None) -> None:
    """Remember the user's entry frame when the process becomes a rank."""
    frames = []
    f = caller
    while f is not None:
        if stack.is_user_file(f.f_code.co_filename):
            frames.append(f)
        f = f.f_back
    functions = [f for f in frames if f.f_code.co_name != "<module>"]
    _entry[:] = [functions[-1] if functions else frames[-1]] if frames else []


# A failed op's future fails through `Future.then` (see `pg.SimWork.get_future`), which
# wraps the message; the report keeps the op's own message, as the backend gave it.
_CALLBACK_PREFIX = "Got the following error when running the callback: "


def _error(exc: BaseException) -> dict[str, str]:
    message = str(exc)
    if message.startswith(_CALLBACK_PREFIX):
        message = message[len(_CALLBACK_PREFIX):].split("\n\nAt:\n")[0].removeprefix("RuntimeError: ")
    return {"type": type(exc).__name__, "message": message}


def record(how: str, code: Any = None, exc: BaseException | None = None, where: list | None = None) -> None:
    """Note how the process is ending (the first exception and its place win)."""
    if exc is not None and not isinstance(exc, SystemExit) and "error" not in _info:
        _info["error"] = _error(exc)
        _info["where"] = stack.traceback_user_frame(exc.__traceback__) or where
        _info["how"] = "exception"
    elif "how" not in _info:
        _info["how"] = how
        if where is not None:
            _info["where"] = where
    if code is not None:
        _info["code"] = _exit_code(code)


def spawn_index() -> int | None:
    """Which child of `torch.multiprocessing.spawn` this process is (None: none): told with its
    init, so that a child killed by a signal, which tells no exit, is still known as one
    (`simdist.script.race_notes.spawned_failures`)."""
    return _info.get("spawn")


def _exit_code(code: Any) -> int:
    if code is None:
        return 0
    return code if isinstance(code, int) else 1


def send() -> None:
    """Tell the coordinator (once) how this rank ends, as soon as the process is leaving."""
    c = client.CLIENT
    if c is None and not _info.get("sent") and (_torchrun_rank() or "spawn" in _info or _script_failed()):
        _info["sent"] = True  # it never called init: its peers may wait there for it (`simdist.script.rendezvous`)
        info = {k: v for k, v in _info.items() if k in ("how", "code", "where", "error", "in_init")}
        rank = int(os.environ["RANK"]) if _torchrun_rank() else None  # (mp.spawn's: which rank it was is unknown)
        with contextlib.suppress(OSError):  # (the run may be over: a script's process that outlived its ranks)
            client.connect(os.environ[env.SOCKET]).send({"t": "init", "rank": rank, "never": info, "pid": os.getpid(),
                                                         "spawn": _info.get("spawn")})
        return
    if c is None or c.rank is None or _info.get("sent"):
        return
    output.flush()
    if "how" not in _info:
        _info["how"] = "returned"
    if "where" not in _info and _entry:
        _info["where"] = stack.where(_entry[0])
    _info["sent"] = True
    if threading.current_thread() is threading.main_thread():  # (the thread whose compute is measured)
        _info["cpu"] = time.thread_time()  # its compute after the last operation counts too
    for fn in _extras:
        try:
            _info.update(fn())
        except Exception as e:  # noqa: BLE001 - the exit report must still go out
            _info.setdefault("warnings", []).append(f"{type(e).__name__}: {e}")
    c.send({"t": "exit", **{k: v for k, v in _info.items() if k != "sent"}})


def claim() -> None:
    """Note this process as the one started for its rank, unless a parent already is: its
    children inherit the pid (`env.RANK_PID`). Called at the layer's install (a launched
    process) and by a fork server's child once it has its request's environment."""
    os.environ.setdefault(env.RANK_PID, str(os.getpid()))


def init_raised() -> None:
    """The process's own init_process_group is raising before it joined any world (torch's
    rendezvous errors: `rank.patches`): it did call init, which the coordinator then says."""
    _info["in_init"] = True


def _script_failed() -> bool:
    """The process the launcher started as-is (the script's own, not torchrun-style) is ending
    with an error before any init: what it raised is why the run never had a process group."""
    return "TORCHELASTIC_RUN_ID" not in os.environ and env.SOCKET in os.environ and \
        os.environ.get(env.RANK_PID) == str(os.getpid()) and ("error" in _info or bool(_info.get("code")))


def _torchrun_rank() -> bool:
    """This process is a rank the launcher started torchrun-style, not a process the script
    started (a DataLoader worker, an `mp.Process`, a child interpreter of
    `subprocess.run([sys.executable, ...])`): they inherit the rank's environment, but a
    report of theirs would stand in for the rank's own (the coordinator keeps the first)."""
    return "TORCHELASTIC_RUN_ID" in os.environ and "RANK" in os.environ and env.SOCKET in os.environ \
        and os.environ.get(env.RANK_PID) == str(os.getpid())


def snapshot() -> dict[str, Any]:
    """What a rank that has not ended says when the launcher asks before killing it (a hang on
    real Gloo; answered from the reader thread, `client.answer_dumps`): what it would send at
    exit (the Flight Recorder, p2p operations) and where its main thread stands: the innermost
    frame of the user's code (`where`, as the simulated side's location) and the whole stack."""
    frame = sys._current_frames().get(threading.main_thread().ident or 0)  # first: the extras may take long
    out: dict[str, Any] = {"where": stack.where(stack.innermost_user(frame)), "frames": stack.capture(frame)}
    del frame
    if "how" in _info or "error" in _info:  # it is on its way out (its end not told yet): how it ends
        out["exiting"] = {k: v for k, v in _info.items() if k in ("how", "code", "where", "error")}
    for fn in _extras:
        try:
            out.update(fn())
        except Exception as e:  # noqa: BLE001 - the rest of the record still goes out
            out.setdefault("warnings", []).append(f"{type(e).__name__}: {e}")
    return out


def _how(wanted: str) -> tuple[str, list | None]:
    """`wanted` with the caller's line when the user's code called it directly; a library
    ending the process (multiprocessing once the target returned) is a normal return."""
    caller = sys._getframe(2)
    if stack.is_user_file(caller.f_code.co_filename):
        return wanted, stack.where(caller)
    return "returned", None


def install() -> None:
    claim()
    orig_exit, orig_os_exit, orig_hook = sys.exit, os._exit, sys.excepthook

    def sys_exit(code: Any = None) -> None:
        how, where = _how("sys.exit")
        record(how, code, sys.exc_info()[1], where)
        send()  # the process is on its way out: tell the coordinator now, not at atexit
        orig_exit(code)

    def os_exit(code: int) -> None:
        how, where = _how("os._exit")
        record(how, code, None, where)
        send()
        orig_os_exit(code)

    def excepthook(etype: Any, value: BaseException, tb: Any) -> None:
        record("exception", 1, value)
        # The simulated backend's "cannot model" error (raised in a rank, or carried up to the
        # process that spawned it) is bad input that simdist reports in one line naming the
        # operation, rank and line; a traceback through simdist's own frames would only bury it.
        if env.unsupported_in(str(value), env.gpus() > 0) is None:
            orig_hook(etype, value, tb)
        send()

    sys.exit = sys_exit
    os._exit = os_exit
    sys.excepthook = excepthook
    _patch_quitters()
    _patch_process_run()
    atexit.register(leave)  # registered before the script runs: the last exit handler to run


class _Quitter:
    """`exit(code)`/`quit(code)`, the builtins `site` adds and scripts call as often as
    `sys.exit`: they raise SystemExit themselves, which reaches no excepthook, so the rank was
    reported as returning normally and its process ended with status 0 (`leave`), where the
    interpreter gives the code (transformers' distributed Trainer test calls `exit(1)`)."""

    def __init__(self, orig: Any, name: str) -> None:
        self.orig, self.name = orig, name

    def __repr__(self) -> str:
        return repr(self.orig)

    def __call__(self, code: Any = None) -> None:
        how, where = _how(self.name)
        record(how, code, None, where)
        send()  # as `sys.exit` does: the process is on its way out
        self.orig(code)


def _patch_quitters() -> None:
    for name in ("exit", "quit"):
        orig = getattr(builtins, name, None)
        if orig is not None and not isinstance(orig, _Quitter):
            setattr(builtins, name, _Quitter(orig, name))


def program_exit(code: int) -> None:
    """The program ended with exit status `code` (a forked rank, `rank.zygote`: a `raise
    SystemExit(code)` that no patched call saw): noted before the exit handlers report it.
    (A freshly launched interpreter gives its handlers no way to see that status.)"""
    if code and "code" not in _info:
        record("SystemExit", code)


def leave() -> None:
    """A rank's last exit handler: report how it ends, then end the process as a forked
    multiprocessing child ends (`os._exit` with the exit status the interpreter would give),
    without the interpreter's teardown. Other processes (the parent a script starts its
    ranks from, DataLoader workers) are left alone.

    Why: tearing down a process that holds a Gloo process group can std::terminate
    ('terminate called without an active exception': Gloo's threads at C++ static
    destruction), so a rank that had finished dies of SIGABRT. Its peers do not care, but its
    parent does: `torch.multiprocessing.spawn` then kills the other ranks, which changes what
    they report (a rank that would fail with 'Connection closed by peer' is killed instead),
    at random under load. What the teardown still owes the script is done first: every
    exit handler has run (this one runs last), and files it left open are flushed.
    (`simdist.report.shutdown_abort` is the rule for a SIGABRT that still comes first.)"""
    send()
    c = client.CLIENT
    if c is None or c.rank is None:
        return
    _flush_open_files()
    client.hard_exit(_exit_code(_info.get("code")))


def _flush_open_files() -> None:
    """What the interpreter's teardown does for files left open: write them out (each is closed
    by its finalizer there; here each is flushed, and those of Python-level classes closed).

    A file is an instance of a class with `_io._IOBase` (every built-in file) or `io.IOBase`
    (a Python subclass) in its MRO: looked up once per type. Not `issubclass(t, io.IOBase)`
    per object: on an ABC each type it has not seen costs a walk of all its subclasses, and a
    rank that imported torch holds ~170,000 objects of ~500 types (0.2 s of CPU per exit, ~1 s
    under load, with its sockets open all that time: its peers learnt of its exit that much
    later than the simulator, which models no teardown, has them learn it)."""
    for std in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__):  # as the interpreter does, by name:
        with contextlib.suppress(Exception):  # a fork server's are frozen out of gc's view (rank.zygote)
            std.flush()
    objs = gc.get_objects()
    # (each object's type, not isinstance: isinstance would ask objects for __class__: proxies warn)
    kinds = {t for t in {type(o) for o in objs} if _FILE_BASES.intersection(t.__mro__)}
    files = [o for o in objs if type(o) in kinds]
    del objs
    _each(files, "flush")
    # A file class of Python's own (`gzip.GzipFile`, bz2's, lzma's) writes its end only when
    # closed, as the teardown's finalizer (`IOBase.__del__`) does: flushed, a gzip file left
    # open was truncated ("Compressed file ended before the end-of-stream marker"). Closed,
    # its end may sit in a built-in file's buffer that it was given: flushed again.
    std = {id(s) for s in (sys.stdout, sys.stderr, sys.__stdout__, sys.__stderr__)}  # (the interpreter's, open)
    _each([f for f in files if type(f).__module__ != "_io" and id(f) not in std], "close")
    _each(files, "flush")


def _each(files: list[Any], method: str) -> None:
    """`file.<method>()` for each file still open, whatever one of them raises."""
    for obj in files:
        with contextlib.suppress(Exception):
            if not obj.closed:
                getattr(obj, method)()


def _patch_process_run() -> None:
    import multiprocessing.process as mpp

    orig = mpp.BaseProcess.run

    def run(self: Any) -> None:
        target = getattr(self, "_target", None)
        if getattr(target, "__module__", None) == "torch.multiprocessing.spawn" and \
                getattr(target, "__name__", None) == "_wrap" and env.active():
            _info["spawn"] = self._args[1]  # mp.spawn's child `i` (`_wrap(fn, i, args, error_file)`): tells if it leaves before init
        try:
            orig(self)
        except BaseException as e:
            record("exception", 1, e)
            raise

    mpp.BaseProcess.run = run  # type: ignore[method-assign]
