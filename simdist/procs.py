"""Local rank processes: start them, watch them, and always end them.

One launcher for every place that runs ranks as processes on this host: the real backend
(`real_backend.launch`), the benchmark sweeps (`real_backend.bench`), the Gloo mismatch
probe (`bench/gloo_mismatch_probe.py`) and users' own scripts (`simdist.script.launch`).
It lives in `simdist` (not in `real_backend`) because simdist itself launches processes
and must not import `real_backend`. Importing it starts neither torch nor a process.

What it guarantees, and how:

* **Nothing outlives the launcher.** Each process leads its own session
  (`start_new_session`), so Ctrl-C in a terminal reaches the launcher only, and the
  launcher can end a rank *and everything it started* with one `killpg`. `LocalProcesses`
  is a context manager: on the way out (normally, on an exception, on Ctrl-C) it kills
  every process group it started and reaps the processes. Should the launcher itself be
  SIGKILLed, ranks end on their own: real-backend workers when their stdin closes, other
  children by calling `die_with_parent()` first thing.
* **Nothing listens beyond this host.** `loopback_store()` hosts the c10d rendezvous store
  on 127.0.0.1 only (torch's TCPStore otherwise listens on every interface, IPv4 and IPv6,
  whatever host name it is given), on a port the kernel picks while the socket stays
  bound, so no other process can take the port between choosing and listening.
  `rank_env()` also pins Gloo's transport to the loopback interface.
* **Ctrl-C and SIGTERM are polled, not raised.** `interrupt_event()` turns them into an
  event that the launcher's polling loop checks, so it can tell its ranks to stop and
  still collect what they recorded; the previous handlers come back on the way out.
* **Watchdog.** `Watchdog` says when nothing has progressed for `timeout_s`; the launcher
  decides what progress is (the real backend: each rank's progress fingerprint).
* **No folder left behind.** `simdist.tempdir.TempDir` (its own module: the launcher
  itself writes no files).
"""

from __future__ import annotations

import contextlib
import datetime
import io
import os
import select
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, TYPE_CHECKING, Any, Protocol

if TYPE_CHECKING:
    import torch.distributed as dist

LOOPBACK = "127.0.0.1"
LOOPBACK_IFNAME = "lo"
LAUNCHER_PID_ENV = "SIMDIST_LAUNCHER_PID"  # set in every child; read by die_with_parent()
REAP_WAIT_S = 10.0  # a SIGKILLed process is gone within this (Linux: at once)


# ----------------------------------------------------------------------------- rendezvous
def loopback_store(world_size: int | None, timeout_s: float = 300.0) -> dist.TCPStore:
    """A c10d TCPStore server that listens on 127.0.0.1 only; its port is `store.port`.
    `world_size` may be None where it is not known yet (a script that starts its own ranks).

    torch binds its server socket to every interface (``*:PORT``, IPv4 and IPv6) whatever
    `host_name` says, and nothing authenticates clients. Handed an already bound and
    listening socket (`master_listen_fd`), it serves on that socket instead, so binding it
    here to 127.0.0.1 keeps the store on this host. The port is chosen by the kernel
    (bind to port 0) and the socket is never released, so there is no window in which
    another process could take it. The store owns (and closes) the socket from then on.
    """
    import torch.distributed as dist

    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    try:
        sock.bind((LOOPBACK, 0))
        sock.listen(max(128, world_size or 0))
        port = int(sock.getsockname()[1])
    except OSError:
        sock.close()
        raise
    fd = sock.detach()
    try:
        return dist.TCPStore(LOOPBACK, port, world_size, is_master=True, wait_for_workers=False,
                             timeout=datetime.timedelta(seconds=timeout_s), master_listen_fd=fd)
    except BaseException:
        os.close(fd)
        raise


def rank_env(rank: int, world_size: int, port: int, base: dict[str, str] | None = None) -> dict[str, str]:
    """The environment of one local rank: torchrun's variables for a one-node run, rendezvous
    at 127.0.0.1:`port`, Gloo on the loopback interface, one OpenMP thread (ranks share the
    host's cores), unbuffered output. Values already in `base` (default: os.environ) for
    GLOO_SOCKET_IFNAME and OMP_NUM_THREADS win, so a user can still choose them."""
    env = dict(os.environ if base is None else base)
    env.update(
        MASTER_ADDR=LOOPBACK,
        MASTER_PORT=str(port),
        WORLD_SIZE=str(world_size),
        RANK=str(rank),
        LOCAL_RANK=str(rank),
        LOCAL_WORLD_SIZE=str(world_size),
        GROUP_RANK="0",
        ROLE_RANK=str(rank),
        PYTHONUNBUFFERED="1",
    )
    env.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_IFNAME)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env


def with_pythonpath(env: dict[str, str], root: str | Path) -> dict[str, str]:
    """`env` with `root` first on PYTHONPATH, so `python -m package.module` finds the package."""
    rest = env.get("PYTHONPATH")
    env["PYTHONPATH"] = os.pathsep.join([str(root)] + ([rest] if rest else []))
    return env


def die_with_parent(parent: int | None = None) -> None:
    """Child side: get SIGKILL when the launcher dies (Linux PR_SET_PDEATHSIG), so a child
    never outlives a launcher that was itself SIGKILLed. Call it first thing in the child.
    The launcher is `parent`, else the process the environment names (LAUNCHER_PID_ENV).
    The signal follows the launcher *thread* that started the child, which is the
    launcher's main thread everywhere here. Elsewhere than Linux this does nothing."""
    try:
        import ctypes

        libc = ctypes.CDLL(None, use_errno=True)
        libc.prctl(1, int(signal.SIGKILL))  # PR_SET_PDEATHSIG
    except (OSError, AttributeError):
        return
    launcher = str(parent) if parent is not None else os.environ.get(LAUNCHER_PID_ENV)
    if launcher is not None and launcher.isdigit() and os.getppid() != int(launcher):
        os._exit(1)  # the launcher died before prctl took effect


# ----------------------------------------------------------------------------- processes
def has_children(pid: int | str = "self") -> bool:
    """Whether process `pid` has a child process now (the children lists of its threads in
    /proc; a zombie not yet reaped counts). True where /proc cannot tell: a caller asks so as
    not to run time forward past a child's progress, which only the wall clock makes."""
    try:
        for tid in os.listdir(f"/proc/{pid}/task"):
            with open(f"/proc/{pid}/task/{tid}/children", encoding="ascii") as f:
                if f.read().strip():
                    return True
    except OSError:
        return True
    return False


class Child(Protocol):
    """What a launcher needs of a process it owns: a `subprocess.Popen`, or a process a fork
    server forked for it (`simdist.forkserver.ForkedProcess`), which leads its own session too."""

    pid: int
    returncode: int | None

    def poll(self) -> int | None: ...

    def wait(self, timeout: float | None = None) -> int: ...


@dataclass
class LocalProcess:
    """One started process (leader of its own session) and what its launcher saw of it."""

    popen: subprocess.Popen | Child
    ended_at: float | None = None  # time.monotonic() when the launcher saw it end
    killed_by_us: bool = False  # SIGKILLed by the launcher (not ended by itself)

    @property
    def pid(self) -> int:
        return self.popen.pid

    @property
    def returncode(self) -> int | None:
        return self.popen.returncode

    def alive(self) -> bool:
        return self.popen.poll() is None

    def kill(self) -> None:
        """SIGKILL the process and everything in its process group."""
        alive = self.alive()
        if alive:
            self.killed_by_us = True
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, signal.SIGKILL)
        if alive:  # a forked process may not have made its session yet (its pid is not reaped: still ours)
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(self.popen.pid, signal.SIGKILL)

    def tell(self, line: str) -> bool:
        """Write one line to its stdin (when it was started with stdin=PIPE and still runs)."""
        stdin = getattr(self.popen, "stdin", None)
        if stdin is None or not self.alive():
            return False
        with contextlib.suppress(OSError, ValueError):
            stdin.write(line + "\n" if isinstance(stdin, io.TextIOBase) else (line + "\n").encode())
            stdin.flush()
            return True
        return False


@dataclass
class LocalProcesses:
    """The processes one launcher started; a context manager that ends them all on exit."""

    procs: list[LocalProcess] = field(default_factory=list)

    def __enter__(self) -> LocalProcesses:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def start(self, argv: list[str], *, env: dict[str, str], cwd: str | Path | None = None,
              stdin: Any = None, stdout: Any = None, stderr: Any = None, text: bool = False,
              pass_fds: tuple[int, ...] = ()) -> LocalProcess:
        """Start `argv` as the leader of a new session (see the module docstring)."""
        env = dict(env)
        env[LAUNCHER_PID_ENV] = str(os.getpid())
        popen = subprocess.Popen(argv, env=env, cwd=None if cwd is None else str(cwd), stdin=stdin,
                                 stdout=stdout, stderr=stderr, text=text, start_new_session=True,
                                 pass_fds=pass_fds)
        return self.adopt(popen)

    def adopt(self, child: subprocess.Popen | Child) -> LocalProcess:
        """Own a process started otherwise (a fork server's): it is ended with the others."""
        proc = LocalProcess(child)
        self.procs.append(proc)
        return proc

    def poll(self, now: float | None = None) -> list[LocalProcess]:
        """The processes that ended since the last poll (their `ended_at` is set to `now`)."""
        now = time.monotonic() if now is None else now
        ended = []
        for p in self.procs:
            if p.ended_at is None and not p.alive():
                p.ended_at = now
                ended.append(p)
        return ended

    def all_ended(self) -> bool:
        return all(not p.alive() for p in self.procs)

    def reap(self, grace_s: float, poll_s: float = 0.05) -> None:
        """Give the processes `grace_s` to exit by themselves, SIGKILL the rest, wait for all."""
        deadline = time.monotonic() + grace_s
        while time.monotonic() < deadline and not self.all_ended():
            time.sleep(poll_s)
        for p in self.procs:
            if p.alive():
                p.kill()
        self._wait_all()
        now = time.monotonic()
        for p in self.procs:
            if p.ended_at is None:
                p.ended_at = now

    def close(self) -> None:
        """SIGKILL every process group (a leader that ended may have left children behind),
        reap every process and close the pipes this launcher holds."""
        for p in self.procs:
            p.kill()
        self._wait_all()
        for p in self.procs:
            for name in ("stdin", "stdout", "stderr"):
                if (stream := getattr(p.popen, name, None)) is not None:
                    with contextlib.suppress(OSError):
                        stream.close()

    def _wait_all(self) -> None:
        for p in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                p.popen.wait(timeout=REAP_WAIT_S)


def processes_with_env(key: str, value: str) -> list[int]:
    """Live processes (not zombies), other than this one, whose environment holds KEY=VALUE:
    what a run tags its processes with (every child inherits it, also the ones a script
    starts itself), so ending a run, and a test, can find every one of them.

    /proc/PID/environ is the environment the process started with (Linux)."""
    mark = f"{key}={value}".encode()
    out = []
    for name in os.listdir("/proc"):
        if not name.isdigit() or int(name) == os.getpid():
            continue
        try:
            with open(f"/proc/{name}/environ", "rb") as fh:
                if mark not in fh.read().split(b"\0"):
                    continue
            with open(f"/proc/{name}/stat", "rb") as fh:
                state = fh.read().rsplit(b")", 1)[1].split()[0]
        except OSError:
            continue
        if state not in (b"Z", b"X"):
            out.append(int(name))
    return out


def read_lines(stream: IO[Any], deadline: float) -> Iterator[str]:
    """Lines of a child's output pipe until EOF; TimeoutError once time.monotonic() passes
    `deadline`, also while the child is silent (which a plain `for line in stream` misses).

    Reads the pipe's file descriptor directly: a buffered reader could hold a whole line
    that `select` no longer reports as readable."""
    fd = stream.fileno()
    buf = b""
    while True:
        while b"\n" in buf:
            line, buf = buf.split(b"\n", 1)
            yield line.decode(errors="replace") + "\n"
        left = deadline - time.monotonic()
        if left <= 0:
            raise TimeoutError("deadline passed while waiting for output")
        ready, _, _ = select.select([fd], [], [], min(left, 1.0))
        if not ready:
            continue
        chunk = os.read(fd, 1 << 16)
        if not chunk:
            if buf:
                yield buf.decode(errors="replace")
            return
        buf += chunk


# ----------------------------------------------------------------------------- signals, watchdog
@contextlib.contextmanager
def interrupt_event(signals: tuple[int, ...] = (signal.SIGINT, signal.SIGTERM), *,
                    twice_raises: bool = False) -> Iterator[threading.Event]:
    """An event set by Ctrl-C / SIGTERM while the block runs; the old handlers come back after.

    With `twice_raises`, a second signal raises KeyboardInterrupt wherever the program is:
    for loops that poll the event between steps that can each take long (one fuzzed
    schedule), so a user who presses Ctrl-C again is not kept waiting. Only the main
    thread can install signal handlers; elsewhere the event is never set (the caller's own
    thread handling applies)."""
    event = threading.Event()

    def handler(*_: Any) -> None:
        if twice_raises and event.is_set():
            raise KeyboardInterrupt
        event.set()

    restore: dict[int, Any] = {}
    if threading.current_thread() is threading.main_thread():
        for sig in signals:
            restore[sig] = signal.signal(sig, handler)
    try:
        yield event
    finally:
        for sig, old in restore.items():
            signal.signal(sig, old)


@dataclass
class Watchdog:
    """Fires when nothing has progressed for `timeout_s`; a start-up that is still under way
    counts as progress for at most `startup_limit_s` (importing torch on a busy host is slow)."""

    timeout_s: float
    startup_limit_s: float = 120.0
    started: float = field(default_factory=time.monotonic)
    last: float = field(init=False)

    def __post_init__(self) -> None:
        self.last = self.started

    def progressed(self, now: float | None = None) -> None:
        self.last = time.monotonic() if now is None else now

    def fired(self, now: float | None = None, *, starting: bool = False) -> bool:
        now = time.monotonic() if now is None else now
        if starting and now - self.started < self.startup_limit_s:
            self.last = now
        return now - self.last > self.timeout_s
