"""Shared test helpers."""

from __future__ import annotations

import gc
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


def pytest_configure(config: pytest.Config) -> None:
    """Ctrl-C as a terminal delivers it, even when the suite itself was started with SIGINT
    ignored (a background job of a shell without job control inherits that, and so would
    every CLI the Ctrl-C tests start: Python never installs its KeyboardInterrupt handler
    for a signal it inherits ignored). A handler, unlike SIG_IGN, is not inherited by exec."""
    import signal

    if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
        signal.signal(signal.SIGINT, signal.default_int_handler)


def run_cli(*args: str, timeout: float = 120):
    """Run the real `simdist` CLI in a subprocess (as users do) and return the CompletedProcess."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "simdist", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


TEST_TAG = "SIMDIST_TEST_TAG"  # put in the CLI's environment: every process it starts, and theirs, inherit it


def run_cli_tagged(*args: str, timeout: float = 600, cwd: Path | None = None):
    """`run_cli` with a fresh tag in the CLI's environment (in `cwd`, default the checkout);
    (result, tag) once it has checked that no process of the run is left
    (`simdist.procs.processes_with_env`)."""
    import os
    import subprocess
    import uuid

    from simdist.procs import processes_with_env

    tag = uuid.uuid4().hex
    res = subprocess.run([sys.executable, "-m", "simdist", *args], capture_output=True, text=True, timeout=timeout,
                         cwd=cwd or ROOT, env={**os.environ, TEST_TAG: tag})
    assert processes_with_env(TEST_TAG, tag) == [], "a process of the run survived it"
    return res, tag


def one_line_error(res, code: int = 2) -> str:
    """The CLI run `res` failed with `code`, one line on stderr, no traceback; that line."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == code, (res.returncode, res.stdout[-500:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr
    return lines[0]


def scenario_file(tmp_path: Path, data: bytes | str, name: str = "s.toml") -> Path:
    """`data` (bytes as they are, or text) written to tmp_path/name."""
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


def strict_json(text: str):
    """json.loads that refuses Infinity and NaN, which are not JSON."""
    import json

    def no(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=no)


@pytest.fixture
def tmp_scenario(tmp_path):
    def write(text: str, name: str = "s.toml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p

    return write


def listening_sockets(pids) -> set[tuple[str, int]]:
    """(address, port) of every TCP socket in LISTEN state that one of `pids` holds, read from
    /proc (no `ss` needed): which interfaces a process accepts connections on."""
    import os
    import socket

    inodes = set()
    for pid in pids:
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:
            continue
        for fd in fds:
            try:
                link = os.readlink(f"/proc/{pid}/fd/{fd}")
            except OSError:
                continue
            if link.startswith("socket:["):
                inodes.add(link[len("socket:["):-1])
    found = set()
    for table, family in (("tcp", socket.AF_INET), ("tcp6", socket.AF_INET6)):
        try:
            lines = Path(f"/proc/net/{table}").read_text().splitlines()[1:]
        except OSError:
            continue
        for line in lines:
            cols = line.split()
            local, state, inode = cols[1], cols[3], cols[9]
            if state != "0A" or inode not in inodes:  # 0A = LISTEN
                continue
            addr_hex, port_hex = local.split(":")
            raw = bytes.fromhex(addr_hex)  # stored as 32-bit words in host (little-endian) order
            raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
            found.add((socket.inet_ntop(family, raw), int(port_hex, 16)))
    return found


def descendants(pid: int) -> list[int]:
    """Live processes below `pid` (children, their children, ...), leaving out this test
    process's own multiprocessing resource tracker: a Dask test starts it once and Python
    keeps it until the test process exits, by design; it is no run's leftover."""
    import os
    from multiprocessing import resource_tracker

    parent = {}
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                fields = Path(f"/proc/{d}/stat").read_text().rsplit(")", 1)[1].split()
            except OSError:
                continue
            if fields[0] != "Z":
                parent[int(d)] = int(fields[1])
    tracker = getattr(resource_tracker._resource_tracker, "_pid", None)
    parent.pop(tracker, None)
    out, todo = [], [pid]
    while todo:
        p = todo.pop()
        kids = [c for c, pp in parent.items() if pp == p]
        out += [k for k in kids if k not in FORK_SERVERS]  # a server's own children do count
        todo += kids
    return out


@pytest.fixture(autouse=True)
def _collector_left_as_found():
    """A test that leaves Python's cycle collector off (code that pauses it without putting
    it back) fails itself, not whichever later test depends on it."""
    was = gc.isenabled()
    yield
    if gc.isenabled() != was:
        gc.enable() if was else gc.disable()
        pytest.fail(f"the test left the cycle collector {'off' if was else 'on'}")


@pytest.fixture(autouse=True)
def _scripts_run_away_from_the_checkout(request, tmp_path_factory, monkeypatch):
    """A test that runs a script (on the session's fork servers: their ranks start in the
    test's working directory) runs it from a fresh folder, not the checkout: `compare` sets
    aside what changes in its working directory while the simulated side runs
    (`simdist.script.workdir`), and from the checkout that was whatever a developer or another
    process wrote there meanwhile; files a script writes land in the folder too."""
    if "script_zygote" in request.fixturenames or "cpu_node_zygote" in request.fixturenames:
        monkeypatch.chdir(tmp_path_factory.mktemp("cwd"))


FORK_SERVERS: set[int] = set()  # the session's fork servers (`real_zygote`, `script_zygote`): no run's leftover


@pytest.fixture(scope="session")
def real_zygote():
    """A fork server for real-backend workers (`real_backend.workers.WorkerZygote`) shared by
    the session's real runs that judge what the ranks did (fidelity, fuzz replays, Flight
    Recorder): each run then forks its workers instead of paying an interpreter start and
    `import torch` per rank. Tests of the launcher's own process handling keep the plain launch."""
    from real_backend.workers import WorkerZygote

    with WorkerZygote() as zygote:
        FORK_SERVERS.add(zygote.pid)
        try:
            yield zygote
        finally:
            FORK_SERVERS.discard(zygote.pid)


@pytest.fixture(scope="session")
def script_zygote():
    """`get(mode)`: a fork server for any script in that mode ("sim" or "gloo";
    `simdist.script.zygote.Zygote(None)`), started on first use and shared by the session's
    script runs that judge what the ranks did (agreement with real Gloo, expected verdicts,
    traces): `run_script(..., zygote=script_zygote(mode))` forks each rank instead of paying
    an interpreter start and `import torch` per rank. Runs whose output must reach a stream
    of their own, and tests of what a user sees of the processes (the CLI, teardown, Ctrl-C,
    SIGKILL), keep the plain launch."""
    yield from _zygotes(8)


@pytest.fixture(scope="session")
def cpu_node_zygote():
    """`script_zygote` for a CPU-only node (`--gpus-per-node 0`: no simulated GPU)."""
    yield from _zygotes(0)


def _zygotes(gpus: int):
    import contextlib
    import subprocess

    from simdist.script.zygote import Zygote

    with contextlib.ExitStack() as stack:
        servers: dict[str, Zygote] = {}

        def get(mode: str) -> Zygote:
            if mode not in servers:
                z = stack.enter_context(Zygote(None, mode=mode, gpus=gpus, stdout=subprocess.DEVNULL,
                                               stderr=subprocess.DEVNULL))
                FORK_SERVERS.add(z.pid)
                stack.callback(FORK_SERVERS.discard, z.pid)
                servers[mode] = z
            return servers[mode]

        yield get


EXAMPLES = ROOT / "examples"


@pytest.fixture(scope="session")
def example_run(script_zygote):
    """`get(name, mode="sim", **kw)`: one run of examples/NAME (`run_script` with `kw`, its
    ranks forked by `script_zygote`), made once per session and shared by the tests that read
    it: the Join and dist tutorials' programs are judged by several modules (agreement with
    real Gloo, the tutorial's lines, the scenario's collectives, the hang report), each of
    them on the same run. A test that needs runs of its own (two runs compared) makes them.
    Each call gives its own copy of the shared report."""
    import copy

    from simdist.script import run_script
    from simdist.script.launch import new_run_id, tagged_processes

    runs: dict[tuple, object] = {}

    def get(name: str, mode: str = "sim", **kw):
        key = (name, mode, tuple(sorted(kw.items())))
        if key not in runs:
            run_id, z = new_run_id(), script_zygote(mode)
            runs[key] = run_script(EXAMPLES / name, timeout_s=300, run_id=run_id, mode=mode, zygote=z, **kw)
            assert tagged_processes(run_id) == [] and descendants(z.pid) == []  # no process of the run survives it
        return copy.deepcopy(runs[key])  # each test its own: one that changes it cannot change another's

    return get


def line_of(path: Path, text: str, after: str | None = None) -> int:
    """1-based number of the first line of `path` containing `text` (after the line containing `after`)."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines) if i >= start and text in line) + 1


def trace_keys(trace) -> list[tuple]:
    """What a script's trace and a scenario's simulated trace are compared on, per entry."""
    return [(e.seq, e.op, e.numel, e.dtype, e.group, e.origin, e.reduce_op, e.root) for e in trace]
