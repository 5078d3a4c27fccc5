"""simdist.procs, the launcher every local rank process goes through: real processes, a real
c10d store, real signals (no mocks)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time

import pytest

from simdist.procs import (
    LOOPBACK,
    LocalProcesses,
    Watchdog,
    interrupt_event,
    loopback_store,
    rank_env,
    read_lines,
)

from .conftest import ROOT, listening_sockets


def _gone(pid: int, within_s: float = 10.0) -> bool:
    """True once `pid` no longer runs (absent, or a zombie nobody reaped yet)."""
    deadline = time.monotonic() + within_s
    while time.monotonic() < deadline:
        try:
            state = open(f"/proc/{pid}/stat").read().rsplit(")", 1)[1].split()[0]
        except OSError:
            return True
        if state == "Z":
            return True
        time.sleep(0.05)
    return False


def test_store_listens_on_loopback_only():
    """torch's TCPStore alone listens on every interface (`*:PORT`, IPv4 and IPv6); ours on 127.0.0.1."""
    dist = pytest.importorskip("torch.distributed")
    store = loopback_store(2, timeout_s=30)
    port = store.port
    assert {addr for addr, p in listening_sockets([os.getpid()]) if p == port} == {LOOPBACK}
    client = dist.TCPStore(LOOPBACK, port, 2, is_master=False)
    store.set("k", "v")
    assert client.get("k") == b"v"
    del client, store
    assert all(p != port for _, p in listening_sockets([os.getpid()]))  # the store closed its socket


def test_rank_env_is_torchrun_like_and_on_loopback():
    env = rank_env(1, 4, 29999, base={"PATH": "/bin", "OMP_NUM_THREADS": "3"})
    assert {k: env[k] for k in ("MASTER_ADDR", "MASTER_PORT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
                                "LOCAL_WORLD_SIZE")} == {"MASTER_ADDR": LOOPBACK, "MASTER_PORT": "29999", "RANK": "1",
                                                         "WORLD_SIZE": "4", "LOCAL_RANK": "1", "LOCAL_WORLD_SIZE": "4"}
    assert env["GLOO_SOCKET_IFNAME"] == "lo" and env["OMP_NUM_THREADS"] == "3"  # the user's choice wins


def test_close_kills_what_a_process_started_too():
    with LocalProcesses() as procs:
        p = procs.start(["sh", "-c", "sleep 60 & echo $!; wait"], env=dict(os.environ), stdout=subprocess.PIPE,
                        text=True)
        grandchild = int(p.popen.stdout.readline())
        assert p.alive() and not _gone(grandchild, 0.2)
    assert p.killed_by_us and p.returncode == -signal.SIGKILL
    assert _gone(grandchild)


def test_reap_gives_a_grace_period_then_kills():
    with LocalProcesses() as procs:
        quick = procs.start([sys.executable, "-c", "pass"], env=dict(os.environ))
        slow = procs.start(["sleep", "60"], env=dict(os.environ))
        t0 = time.monotonic()
        procs.reap(grace_s=1.0)
        assert time.monotonic() - t0 < 8
    assert quick.returncode == 0 and not quick.killed_by_us
    assert slow.returncode == -signal.SIGKILL and slow.killed_by_us and slow.ended_at is not None


def test_a_child_dies_with_its_launcher():
    """SIGKILL of the launcher leaves nothing behind: the child asked for PR_SET_PDEATHSIG."""
    child = ("from simdist.procs import die_with_parent; die_with_parent(); print('ready', flush=True); "
             "import time; time.sleep(60)")
    launcher = (f"import os, subprocess, sys, time; from simdist.procs import LocalProcesses; "
                f"p = LocalProcesses().start([sys.executable, '-c', {child!r}], env=dict(os.environ), "
                f"stdout=subprocess.PIPE, text=True); assert p.popen.stdout.readline() == 'ready\\n'; "
                f"print(p.pid, flush=True); time.sleep(60)")
    proc = subprocess.Popen([sys.executable, "-c", launcher], stdout=subprocess.PIPE, text=True, cwd=ROOT)
    try:
        pid = int(proc.stdout.readline())
        assert not _gone(pid, 0.2)
        proc.kill()
        proc.wait()
        assert _gone(pid)
    finally:
        proc.kill()
        proc.wait()
        proc.stdout.close()


def test_interrupt_event_turns_sigint_into_an_event_and_restores_the_handler():
    before = signal.getsignal(signal.SIGINT)
    with interrupt_event() as ev:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not ev.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ev.is_set()
    assert signal.getsignal(signal.SIGINT) is before


def test_a_second_signal_raises_at_once_when_asked():
    before = signal.getsignal(signal.SIGINT)
    with pytest.raises(KeyboardInterrupt), interrupt_event(twice_raises=True) as ev:
        os.kill(os.getpid(), signal.SIGINT)
        deadline = time.monotonic() + 5
        while not ev.is_set() and time.monotonic() < deadline:
            time.sleep(0.01)
        assert ev.is_set()  # the first one only set the event
        os.kill(os.getpid(), signal.SIGINT)
        time.sleep(5)  # a long step: the second signal ends it
        pytest.fail("the second SIGINT did not raise")
    assert signal.getsignal(signal.SIGINT) is before


def test_read_lines_sees_every_buffered_line_and_times_out_on_silence():
    code = "import sys, time; sys.stdout.write('a\\nb\\n'); sys.stdout.flush(); time.sleep(30)"
    with LocalProcesses() as procs:
        p = procs.start([sys.executable, "-c", code], env=dict(os.environ), stdout=subprocess.PIPE)
        lines = read_lines(p.popen.stdout, time.monotonic() + 30)
        assert next(lines) == "a\n" and next(lines) == "b\n"  # both arrived in one read
        t0 = time.monotonic()
        with pytest.raises(TimeoutError):
            next(read_lines(p.popen.stdout, t0 + 0.3))  # silent child: the deadline still holds
        assert time.monotonic() - t0 < 5


def test_watchdog_fires_after_timeout_and_allows_a_slow_start():
    dog = Watchdog(1.0, startup_limit_s=3.0, started=0.0)
    assert not dog.fired(0.9) and dog.fired(1.1)
    dog.progressed(1.1)
    assert not dog.fired(2.0) and dog.fired(2.2)
    slow = Watchdog(1.0, startup_limit_s=3.0, started=0.0)
    assert not slow.fired(2.9, starting=True)  # still starting: counts as progress
    assert slow.fired(4.0, starting=True)  # ... but only up to the start-up limit


def test_a_fork_server_interrupted_while_it_starts_is_ended():
    """Ctrl-C while the launcher waits for a fork server's "ready" ends the server (here a
    process that never says it: `python -m timeit` sleeping) instead of leaking it."""
    from simdist.forkserver import ForkServer

    owner = LocalProcesses()

    def interrupt(*_):
        raise KeyboardInterrupt

    old = signal.signal(signal.SIGALRM, interrupt)
    signal.setitimer(signal.ITIMER_REAL, 1.0)
    try:
        with pytest.raises(KeyboardInterrupt):
            ForkServer("timeit", ["-n", "1", "-r", "1", "import time; time.sleep(60)"], env=dict(os.environ),
                       owner=owner)
    finally:
        signal.setitimer(signal.ITIMER_REAL, 0)
        signal.signal(signal.SIGALRM, old)
    assert len(owner.procs) == 1 and not owner.procs[0].alive()
