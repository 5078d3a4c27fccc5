"""Fork servers (zygotes): one process with torch already imported forks each rank process.

A rank started as a fresh interpreter pays the interpreter's start and `import torch`
(1-2 CPU seconds) before it does anything; a caller that runs many short runs (the script
fuzzer's schedules, the test suite's real-backend scenarios) pays that again and again. A
fork server imports once and forks a child per request, which then becomes what the fresh
process would have been. Two servers use this module: `simdist.script.zygote` (a user's
script's ranks) and `real_backend.zygote` (real-backend workers). What they share is here,
both sides of it:

* **Launcher side** (`ForkServer`, `ForkedProcess`): start the server as a local process
  (`simdist.procs.LocalProcesses`, so it leads its own session and ends with the
  launcher's `close`), send requests, and give the launcher the part of `subprocess.Popen`
  it uses (pid, poll, wait, returncode, stdin) for each forked child. The server is the
  children's parent, so it reaps them and reports each exit status; `pump` reads those
  reports.
* **Server side** (`main`, `run_program`, `leave`): the fork/reap/report loop, and what
  every child does first: lead a new session (the launcher ends it and all it started with
  one `killpg`), die with the server (PR_SET_PDEATHSIG; the server dies with its launcher
  the same way), take the request's file descriptors as its stdin/stdout/stderr
  (SCM_RIGHTS), its environment (`os.environ` replaced, which is the C environment too), its
  working directory and `sys.argv`, fresh seeds for `random` and NumPy (a fresh interpreter
  seeds them from the OS), what torch read from the environment at import
  (`apply_torch_env`); at the end it leaves with `os._exit` after what the interpreter's
  shutdown does that anyone can see (joining non-daemon threads, atexit handlers, flushes):
  tearing down torch's modules one by one takes ~1 s and changes nothing a peer could see.

The server imports torch before forking and never starts threads or touches torch's thread
pools, which is what makes forking it safe (DataLoader workers are forked from torch
processes the same way). Messages are JSON objects on a SOCK_SEQPACKET socket pair (one
message per packet; file descriptors ride along with theirs); requests
``{..., "stdio": [targets]}`` with the descriptors to install at those targets (and
``{"spares": n}``, no reply), replies ``{"ready": pid}``, ``{"forked": pid}`` and
``{"pid": pid, "status": status}`` (negative for a signal, as `subprocess` does). Standard library only (and `simdist.procs`): the
server side runs inside users' rank processes.
"""

from __future__ import annotations

import atexit
import contextlib
import functools
import json
import os
import random
import select
import selectors
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from simdist import procs

START_TIMEOUT_S = 120.0  # importing torch on a loaded host can take long
MAX_MESSAGE = 1 << 20  # a request carries an environment: tens of kB at most
MAX_FDS = 8


# ----------------------------------------------------------------------------- messages
def send(sock: socket.socket, header: dict[str, Any], fds: Sequence[int] = ()) -> None:
    data = json.dumps(header, separators=(",", ":")).encode()
    if fds:
        socket.send_fds(sock, [data], list(fds))
    else:
        sock.send(data)


def recv(sock: socket.socket) -> tuple[dict[str, Any], list[int]] | None:
    """One message and the descriptors that came with it; None once the other side closed."""
    try:
        data, fds, _, _ = socket.recv_fds(sock, MAX_MESSAGE, MAX_FDS)
    except OSError:
        return None
    if not data:
        for fd in fds:
            os.close(fd)
        return None
    return json.loads(data), fds


# ----------------------------------------------------------------------------- launcher side
class ForkedProcess:
    """A process the server forked, seen through the server's reports. `stdin`: the write end
    of its stdin pipe, when the launcher gave it one (`simdist.procs.LocalProcess.tell`)."""

    def __init__(self, server: ForkServer, pid: int, stdin: IO[bytes] | None = None):
        self.server, self.pid, self.stdin = server, pid, stdin
        self.returncode: int | None = None

    def poll(self) -> int | None:
        if self.returncode is None:
            self.server.pump(0.0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(str(self.pid), timeout or 0.0)
            self.server.pump(left)
        return self.returncode


class ForkServer:
    """The launcher's end of a fork server: `python -m MODULE ARGS FD` started through `owner`
    (which ends it, and `close` ends what it forked); OSError when it does not get ready."""

    def __init__(self, module: str, args: Sequence[str], *, env: dict[str, str], owner: procs.LocalProcesses,
                 cwd: str | Path | None = None, stdin: int | IO | None = None, stdout: int | IO | None = None,
                 stderr: int | IO | None = None):
        self._owner = owner
        self._children: dict[int, ForkedProcess] = {}
        self._early: dict[int, int] = {}  # exits reported before `fork` saw the fork's reply
        self._replies: list[dict[str, Any]] = []
        self._lock = threading.RLock()  # a launcher may poll its children from several threads
        self._sock, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        self._sel = selectors.DefaultSelector()
        try:
            self.proc = owner.start([sys.executable, "-m", module, *args, str(theirs.fileno())], env=env, cwd=cwd,
                                    stdin=stdin, pass_fds=(theirs.fileno(),), stdout=stdout,
                                    stderr=stderr)
        except BaseException:
            self.close()
            raise
        finally:
            theirs.close()
        try:  # Ctrl-C while the server imports must end it too
            self._sel.register(self._sock, selectors.EVENT_READ)
            if self._next_reply(START_TIMEOUT_S).get("ready") is None:
                raise OSError(f"the fork server {module} did not start")
        except BaseException:
            self.close()
            raise

    @property
    def pid(self) -> int:
        return self.proc.pid

    def fileno(self) -> int:
        """The control socket: readable when the server has reported something (a child's
        exit), so a launcher waiting in its own `select` for its children to end wakes at
        once (`pump`, through `ForkedProcess.poll`, reads the report) instead of polling."""
        return self._sock.fileno()

    def pump(self, timeout: float | None) -> None:
        """Read what the server reported (exits, replies), waiting up to `timeout` seconds."""
        with self._lock:
            if self._sock.fileno() < 0 or not self._sel.select(timeout):
                return
            msg = recv(self._sock)
            if msg is None:
                self._lost()
                return
            header, fds = msg
            for fd in fds:
                os.close(fd)
            if "status" in header:
                child = self._children.pop(int(header["pid"]), None)
                if child is not None:
                    child.returncode = int(header["status"])
                else:
                    self._early[int(header["pid"])] = int(header["status"])
            else:
                self._replies.append(header)

    def _lost(self) -> None:
        """The server is gone: its children died with it (PR_SET_PDEATHSIG)."""
        for child in self._children.values():
            child.returncode = -signal.SIGKILL
        self._children.clear()
        self._replies.append({})
        self._sel.unregister(self._sock)
        self._sock.close()

    def _next_reply(self, timeout: float) -> dict[str, Any]:
        deadline = time.monotonic() + timeout
        with self._lock:
            while not self._replies and time.monotonic() < deadline and self._sock.fileno() >= 0:
                self.pump(deadline - time.monotonic())
            return self._replies.pop(0) if self._replies else {}

    def fork(self, request: dict[str, Any], stdio: dict[int, int] | None = None,
             stdin: IO[bytes] | None = None) -> ForkedProcess:
        """Have the server fork a child for `request`; `stdio` maps 0/1/2 to descriptors of
        ours that become the child's (sent with the request; we keep our copies)."""
        targets, fds = zip(*sorted((stdio or {}).items()), strict=True) if stdio else ((), ())
        with self._lock:
            self._request(request, targets, fds)
            return self._forked(stdin)

    def keep_spares(self, n: int) -> None:
        """Have the server keep `n` children forked ahead of requests, while it is idle, so that
        the next run (of up to `n` processes: the script fuzzer's) need not wait for forks."""
        with self._lock:
            if self._sock.fileno() >= 0:
                send(self._sock, {"spares": n})

    def fork_all(self, requests: Sequence[dict[str, Any]]) -> list[ForkedProcess]:
        """`fork` for several requests (no descriptors), all sent before the first reply is
        read: the server forks them back to back, not one round trip apart (a run's ranks
        start together, as a launcher's would)."""
        with self._lock:
            for request in requests:
                self._request(request, (), ())
            return [self._forked(None) for _ in requests]

    def _request(self, request: dict[str, Any], targets: Sequence[int], fds: Sequence[int]) -> None:
        if self._sock.fileno() < 0:
            raise OSError("the fork server is gone")
        send(self._sock, {**request, "stdio": list(targets)}, fds)

    def _forked(self, stdin: IO[bytes] | None) -> ForkedProcess:
        """The child of the oldest request not yet answered (the server answers in order)."""
        pid = self._next_reply(START_TIMEOUT_S).get("forked")
        if pid is None:
            raise OSError("the fork server did not fork")
        child = ForkedProcess(self, int(pid), stdin)
        child.returncode = self._early.pop(child.pid, None)
        if child.returncode is None:
            self._children[child.pid] = child
        return child

    def close(self) -> None:
        """End the server and everything it forked."""
        try:
            self._sock.close()
        finally:
            self._sel.close()
            self._end()

    def _end(self) -> None:
        """End the processes of `owner` (a server may find more of its own to end)."""
        self._owner.close()

    def __enter__(self) -> ForkServer:
        return self

    def __exit__(self, *exc: Any) -> None:
        self.close()


# ----------------------------------------------------------------------------- server side
Child = Callable[[dict[str, Any]], int]  # in a forked child, after `_become`: its exit status


def _status(raw: int) -> int:
    return -os.WTERMSIG(raw) if os.WIFSIGNALED(raw) else os.WEXITSTATUS(raw)


def _become(request: dict[str, Any], fds: list[int], closing: Sequence[int], server: int) -> None:
    """In a forked child: what a freshly launched process of the request would be, as far as
    the request says (the module docstring's list)."""
    os.setsid()
    signal.set_wakeup_fd(-1)
    signal.signal(signal.SIGCHLD, signal.SIG_DFL)
    procs.die_with_parent(server)
    for fd in closing:
        os.close(fd)
    for target, fd in zip(request.get("stdio", []), fds, strict=True):
        os.dup2(fd, int(target))
    for fd in fds:
        if fd not in request.get("stdio", []):
            os.close(fd)
    os.environ.clear()
    os.environ.update(request["env"])
    os.environ[procs.LAUNCHER_PID_ENV] = str(os.getpid())  # its own children's expected parent
    if request.get("cwd"):
        os.chdir(request["cwd"])
    sys.argv = list(request["argv"])
    random.seed()
    if "numpy" in sys.modules:
        sys.modules["numpy"].random.seed()
    apply_torch_env()


def apply_torch_env() -> None:
    """In a forked child, once its environment is the request's: redo what torch read from
    the environment when the server imported it, so the child sees the run's environment as
    a launched process does -- the intra-op thread count (`OMP_NUM_THREADS`, read when torch
    loads OpenMP) and c10d's debug level (`TORCH_DISTRIBUTED_DEBUG`, read by
    `import torch.distributed`). Through `sys.modules`: a server that has not imported torch
    has nothing to redo (the child's own import reads the environment)."""
    torch = sys.modules.get("torch")
    if torch is None:
        return
    threads = os.environ.get("OMP_NUM_THREADS", "")
    if threads.isdigit() and int(threads) > 0:
        # torch sizes its OpenMP pool by MKL's count, which (MKL_DYNAMIC) stays within the
        # cores it may use: OMP_NUM_THREADS=3 or 8 gives 2 on 2 CPUs (measured, torch 2.13)
        torch.set_num_threads(min(int(threads), len(os.sched_getaffinity(0))))
    c10d = sys.modules.get("torch._C._distributed_c10d")
    if c10d is not None and "torch.distributed" in sys.modules:
        c10d.set_debug_level_from_env()


class _Server:
    """Forks a child per request and reports the exits (`loop`). Spares (`keep_spares`): children
    forked while the server is idle, each waiting on a socket of its own for a request, which
    it then takes instead of a fork (the server's state does not change between requests)."""

    def __init__(self, control: socket.socket, child: Child):
        self.control, self.child = control, child
        self.rfd, self.wfd = os.pipe()
        os.set_blocking(self.wfd, False)
        signal.set_wakeup_fd(self.wfd)
        signal.signal(signal.SIGCHLD, lambda *_: None)  # only to wake select() through the wakeup fd
        self.children: set[int] = set()
        self.spares: dict[int, socket.socket] = {}  # pid -> our end of its socket
        self.want = 0  # spares to keep
        self.unused: set[int] = set()  # spares that have not had a request
        self.pid = os.getpid()

    def loop(self) -> int | None:
        """Returns in a child (`child`'s exit status, to `leave` with), or None in the server
        once the control socket closed."""
        while True:
            idle = len(self.spares) < self.want  # a spare is made only when no request waits
            ready, _, _ = select.select([self.control, self.rfd], [], [], 0 if idle else None)
            if self.rfd in ready:
                with contextlib.suppress(BlockingIOError):
                    os.read(self.rfd, 4096)
            self._reap()
            code = None
            if self.control in ready:
                msg = recv(self.control)
                if msg is None:
                    return None
                request, fds = msg
                if "spares" in request:
                    self.want = int(request["spares"])
                    while len(self.spares) > self.want:  # a spare whose socket closes ends
                        self.spares.popitem()[1].close()
                else:
                    code = self._start(request, fds)
            elif idle:
                code = self._spare()
            if code is not None:  # in a child
                return code

    def _reap(self) -> None:
        while self.children:
            pid, raw = os.waitpid(-1, os.WNOHANG)
            if pid == 0:
                break
            self.children.discard(pid)
            if pid in self.unused:  # a spare that ended (not wanted, killed) was nobody's child: not reported
                self.unused.discard(pid)
                with contextlib.suppress(KeyError):
                    self.spares.pop(pid).close()
                continue
            send(self.control, {"pid": pid, "status": _status(raw)})

    def _fork(self) -> int:
        for stream in (sys.stdout, sys.stderr):  # nothing of ours is written twice
            with contextlib.suppress(Exception):
                stream.flush()
        return os.fork()

    def _ours(self) -> tuple[int, ...]:
        """The server's descriptors, for a child to close."""
        return (self.rfd, self.wfd, self.control.detach(), *(s.detach() for s in self.spares.values()))

    def _start(self, request: dict[str, Any], fds: list[int]) -> int | None:
        """A child for `request`: a spare, else a fork; its exit status in the child."""
        while self.spares:
            pid = next(iter(self.spares))  # the oldest: surely waiting already
            sock = self.spares.pop(pid)
            with contextlib.suppress(OSError), sock:
                send(sock, request, fds)
                self.unused.discard(pid)
                break
        else:
            pid = self._fork()
            if pid == 0:  # a failed set-up ends the child as a failed program would, never serves
                code = run_program(functools.partial(_become, request, fds, self._ours(), self.pid))
                return code or self.child(request)
            self.children.add(pid)
        for fd in fds:
            os.close(fd)
        send(self.control, {"forked": pid})
        return None

    def _spare(self) -> int | None:
        mine, theirs = socket.socketpair(socket.AF_UNIX, socket.SOCK_SEQPACKET)
        pid = self._fork()
        if pid == 0:  # wait for a request, then become its child (or end with the server)
            mine.close()
            signal.set_wakeup_fd(-1)
            procs.die_with_parent(self.pid)
            for fd in self._ours():
                os.close(fd)
            msg = recv(theirs)
            theirs.close()
            if msg is None:  # the server is closing
                os._exit(0)
            request, fds = msg
            code = run_program(functools.partial(_become, request, fds, (), self.pid))
            return code or self.child(request)
        theirs.close()
        self.children.add(pid)
        self.unused.add(pid)
        self.spares[pid] = mine
        return None


def run_program(body: Callable[[], object]) -> int:
    """Run `body` as the interpreter runs a program: the exit status it would give
    (`SystemExit`'s code; an uncaught exception through `sys.excepthook` and 1)."""
    try:
        body()
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


def leave(code: int) -> None:
    """A forked child's exit: what the interpreter's shutdown does that is visible, in its order
    (`Py_FinalizeEx`), then _exit: `threading._shutdown` (its exit hooks, which wake an idle
    `ThreadPoolExecutor`'s workers, then the joins; joins first hung such a rank for good:
    inductor leaves one), then the `atexit` functions."""
    threading._shutdown()  # type: ignore[attr-defined]
    atexit._run_exitfuncs()
    for stream in (sys.stdout, sys.stderr):
        with contextlib.suppress(Exception):
            stream.flush()
    os._exit(code)


def main(child: Child) -> int:
    """A server's process, once its imports are done: ``sys.argv[-1]`` is the control socket."""
    control = socket.socket(fileno=int(sys.argv[-1]))
    send(control, {"ready": os.getpid()})
    code = _Server(control, child).loop()
    if code is not None:  # in a forked child
        leave(code)
    return 0  # the server itself: the launcher went away
