"""The fork server (zygote): one process with torch and simdist's rank layer already imported
that forks a rank process per request, so a run does not pay an interpreter start and
`import torch` (1-2 s) per rank. The fuzzer runs hundreds of short schedules this way.

Started by `simdist.script.zygote.Zygote` as `python -m simdist.script.rank.zygote SCRIPT FD`
with the run's bootstrap environment, so the rank layer (sitecustomize) is installed here
exactly as in a freshly launched rank; FD is its control socket. Per request
(`{"env": {...}, "argv": [...]}`) it forks a child that becomes what `python SCRIPT ARGS`
with that environment would be:

* a new session (the launcher ends it and everything it starts with one `killpg`), dying
  with the zygote (PR_SET_PDEATHSIG, re-armed by the rank layer's fork hook);
* `os.environ` replaced by the request's (RANK, WORLD_SIZE, the coordinator's socket, the
  run id, `--batches` caps: children the script execs inherit them), `sys.argv` and
  `sys.path[0]` as the interpreter sets them for a script, fresh seeds for `random` and
  NumPy (a fresh interpreter seeds them from the OS; torch's default seed is fixed anyway);
* the script runs as the `__main__` module, compiled and executed as the interpreter runs
  a script file (not imported: it is the user's program, not a module); an uncaught exception goes through
  `sys.excepthook` and exit status 1, `SystemExit` gives its code; then the child does what
  the interpreter does at exit that anyone can see (joins non-daemon threads, runs the
  atexit handlers, flushes stdout and stderr) and leaves with `os._exit`, as forked
  multiprocessing children do: tearing down torch's thousands of modules one by one takes
  ~1 s and changes nothing a rank's peers or the report could see.

The zygote reaps its children and reports each exit status (`{"pid", "status"}`, negative
for a signal, as `subprocess` does); it ends when its control socket closes. It imports
torch before forking and never starts threads or touches torch's thread pools, which is
what makes forking it safe (DataLoader workers are forked from torch processes the same way).
"""

from __future__ import annotations

import ast
import atexit
import builtins
import contextlib
import importlib
import os
import random
import select
import signal
import socket
import sys
import threading
import types
from typing import Any

from simdist import procs
from simdist.script import wire

# Imported once here rather than in every rank; what a DDP/ZeRO/Join script typically uses.
PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "torch.nn", "torch.nn.functional", "torch.nn.parallel", "torch.optim",
           "torch.utils.data", "torch.utils.data.distributed", "torch.multiprocessing",
           "torch.distributed.algorithms.join", "torch.distributed.optim", "argparse", "numpy")
_SAFE_TOP = {"torch", "numpy"}  # the script's own imports preloaded only from these packages


def _script_imports(path: str) -> list[str]:
    """Modules the script imports at top level from torch or numpy (importing them has no
    effect a rank would see; the user's own modules are left to each rank)."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, ValueError):
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return [n for n in names if n.split(".")[0] in _SAFE_TOP]


def preload(script: str) -> None:
    for name in (*PRELOAD, *_script_imports(script)):
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _run_as_main(path: str) -> None:
    """What `python PATH` does with the file: compile it, run it as a fresh `__main__`."""
    with open(path, "rb") as fh:
        code = compile(fh.read(), path, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __spec__=None, __loader__=None, __cached__=None)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _child(request: dict[str, Any], control: socket.socket, wake: int) -> int:
    """In the forked child: become `python SCRIPT ARGS` with the request's environment; the
    exit status."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    control.close()
    os.close(wake)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[procs.LAUNCHER_PID_ENV] = str(os.getpid())  # its children's expected parent (rank.boot)
    argv = list(request["argv"])
    sys.argv = argv
    sys.path[0] = os.path.dirname(os.path.abspath(argv[0]))
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    from simdist.script.rank import batches

    batches.configure()
    try:
        _run_as_main(argv[0])
    except SystemExit as e:
        code = e.code
        if code is None or isinstance(code, int):
            return code or 0
        sys.stderr.write(f"{code}\n")
        return 1
    except BaseException:  # noqa: BLE001 - what the interpreter does with an uncaught exception
        sys.excepthook(*sys.exc_info())
        return 1
    return 0


def _status(raw: int) -> int:
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def serve(control: socket.socket) -> int | None:
    """Fork children on request and report their exits; returns in a child (its exit status),
    or None in the zygote once the control socket closed."""
    rfd, wfd = os.pipe()
    os.set_blocking(wfd, False)
    signal.set_wakeup_fd(wfd)
    signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through the wakeup fd
    children: set[int] = set()
    while True:
        ready, _, _ = select.select([control, rfd], [], [])
        if rfd in ready:
            with contextlib.suppress(BlockingIOError):
                os.read(rfd, 4096)
        while children:
            pid, raw = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            children.discard(pid)
            wire.send(control, {"pid": pid, "status": _status(raw)})
        if control in ready:
            msg = wire.recv(control)
            if msg is None:
                return None
            pid = os.fork()
            if pid == 0:
                os.close(wfd)
                return _child(msg[0], control, rfd)
            children.add(pid)
            wire.send(control, {"forked": pid})


def _leave(code: int) -> None:
    """A forked rank's exit: what the interpreter's shutdown does that is visible, then _exit."""
    main = threading.main_thread()
    for t in threading.enumerate():
        if t is not main and not t.daemon:
            t.join()
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main() -> int:
    control = socket.socket(fileno=int(sys.argv[2]))
    preload(sys.argv[1])
    wire.send(control, {"ready": os.getpid()})
    code = serve(control)
    if code is not None:  # in a forked rank
        _leave(code)
    return 0  # the zygote itself: the launcher went away


if __name__ == "__main__":
    sys.exit(main())
