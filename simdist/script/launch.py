"""Starting a user's script as torchrun would, or as-is, and ending every process it made.

Two ways users start ranks, one interface:

* torchrun-style (`nproc_per_node=N`): N processes `python SCRIPT ARGS`, each with the
  environment torchrun gives its workers (RANK, LOCAL_RANK, WORLD_SIZE, MASTER_ADDR, ...);
* as-is (`nproc_per_node=None`): one process `python SCRIPT ARGS` that starts its own
  ranks (`torch.multiprocessing.spawn`, `multiprocessing.Process`); they reach the
  coordinator through the inherited environment and identify themselves at init.

Every process of a run carries SIMDIST_SCRIPT_RUN=<run id> in its environment. Ending a run
kills the launched processes' groups, then every process still tagged with the run id, so
nothing survives a hang, an error or Ctrl-C; processes also die with their parent
(`rank.boot`), which covers SIGKILL of simdist itself. Kept small and self-contained so it
can move onto a shared local-process launcher later.
"""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO

from simdist.flightrec import FR_BUFFER_SIZE, FR_ENV
from simdist.script import env

MASTER_ADDR = "127.0.0.1"


def free_port() -> str:
    """A TCP port nobody listens on now (real Gloo ranks rendezvous there)."""
    import socket

    with socket.socket() as s:
        s.bind((MASTER_ADDR, 0))
        return str(s.getsockname()[1])


def torchrun_env(rank: int, nproc: int, run_id: str, port: str) -> dict[str, str]:
    """What torchrun (standalone, one node) sets for worker `rank` of `nproc`."""
    return {
        "RANK": str(rank), "LOCAL_RANK": str(rank), "WORLD_SIZE": str(nproc), "LOCAL_WORLD_SIZE": str(nproc),
        "GROUP_RANK": "0", "GROUP_WORLD_SIZE": "1", "ROLE_RANK": str(rank), "ROLE_WORLD_SIZE": str(nproc),
        "ROLE_NAME": "default", "MASTER_ADDR": MASTER_ADDR, "MASTER_PORT": port,
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "False",
    }


@dataclass
class Launch:
    """The processes of one script run."""

    run_id: str
    procs: list[subprocess.Popen] = field(default_factory=list)

    def done(self) -> bool:
        return all(p.poll() is not None for p in self.procs)

    def returncodes(self) -> list[int | None]:
        return [p.poll() for p in self.procs]


def base_env(socket_path: str, run_id: str, gpus: int, mode: str) -> dict[str, str]:
    e = dict(os.environ)
    paths = [str(env.BOOTSTRAP_DIR)] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p]
    e.update({
        "PYTHONPATH": os.pathsep.join(paths),
        env.SOCKET: socket_path,
        env.RUN_ID: run_id,
        env.GPUS: str(gpus),
        env.MODE: mode,
        env.PARENT: str(os.getpid()),
    })
    if mode == env.GLOO:
        e.setdefault(FR_ENV, FR_BUFFER_SIZE)
    return e


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def start(script: Path, args: Sequence[str], socket_path: str, *, nproc_per_node: int | None, gpus: int,
          stdout: int | IO | None = None, run_id: str | None = None, mode: str = env.SIM) -> Launch:
    run = Launch(run_id or new_run_id())
    common = base_env(socket_path, run.run_id, gpus, mode)
    port = free_port()
    cmd = [sys.executable, str(script), *args]
    envs = [common] if nproc_per_node is None else [
        {**common, **torchrun_env(r, nproc_per_node, run.run_id, port),
         "OMP_NUM_THREADS": common.get("OMP_NUM_THREADS", "1")}
        for r in range(nproc_per_node)
    ]
    try:
        for e in envs:
            run.procs.append(subprocess.Popen(cmd, env=e, start_new_session=True, stdout=stdout))
    except OSError:
        end(run)
        raise
    return run


def tagged_processes(run_id: str) -> list[int]:
    """Live processes (not zombies) whose environment carries this run's id."""
    mark = f"{env.RUN_ID}={run_id}".encode()
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


def end(run: Launch, grace_s: float = 2.0) -> None:
    """Kill every process of the run and reap the ones we started."""
    for p in run.procs:
        try:
            os.killpg(p.pid, signal.SIGKILL)  # its session's group, even after the leader exited
        except OSError:
            pass
    deadline = time.monotonic() + grace_s
    while True:
        left = tagged_processes(run.run_id)
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        for p in run.procs:
            try:
                p.wait(timeout=0.05)
            except subprocess.TimeoutExpired:
                pass
        if (not left and run.done()) or time.monotonic() > deadline:
            return
        time.sleep(0.02)
