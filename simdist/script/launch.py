"""Starting a user's script as torchrun would, or as-is, and ending every process it made.

Two ways users start ranks, one interface:

* torchrun-style (`nproc_per_node=N`): N processes `python SCRIPT ARGS`, each with the
  environment torchrun gives its workers (`simdist.procs.rank_env` plus torchrun's own
  RANK/ROLE/TORCHELASTIC variables);
* as-is (`nproc_per_node=None`): one process `python SCRIPT ARGS` that starts its own
  ranks (`torch.multiprocessing.spawn`, `multiprocessing.Process`); they reach the
  coordinator through the inherited environment and identify themselves at init.

Processes are started and ended by `simdist.procs.LocalProcesses` (each leads its own
session; ending a run kills every session's group), and every process of a run also carries
SIMDIST_SCRIPT_RUN=<run id>, so a process that left its group (a script may call setsid) is
found and killed too. Each process dies with its parent (`procs.die_with_parent`, called by
the rank-side bootstrap), which covers SIGKILL of simdist itself.

Rendezvous: simulated ranks need none (no TCP at all; MASTER_PORT is only what torchrun
would show, in both modes, so a script that prints it prints the same). On real Gloo the
stores are torch's own, on 127.0.0.1 only, whatever address the script names (`rank.patches`):
torchrun-style ranks meet at the store the launcher hosts, as torchrun's agent hosts one
(`procs.loopback_store`); a script that starts its own ranks with `env://` or `tcp://` has
its rank 0 host the store as torch's rendezvous does (`simdist.script.stores`), at a port the
launcher picks for the run (`host_port`), not the script's MASTER_PORT: nothing listens beyond
this host, and two runs of a script with a hard-coded MASTER_PORT do not collide.
"""

from __future__ import annotations

import os
import random
import signal
import socket
import sys
import time
import uuid
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from simdist.flightrec.format import FR_BUFFER_SIZE, FR_ENV
from simdist.procs import (
    LOOPBACK,
    LOOPBACK_IFNAME,
    Child,
    LocalProcesses,
    loopback_store,
    processes_with_env,
    rank_env,
)
from simdist.script import env

TORCHRUN_PORT = 29500  # torchrun's default MASTER_PORT: what every rank sees, in both modes (nothing listens)
NEAR_PORTS = 4  # MASTER_PORT + 1 .. + NEAR_PORTS: each run's own port for each (`near_ports`)


def torchrun_env(rank: int, nproc: int, run_id: str, port: int, base: dict[str, str]) -> dict[str, str]:
    """What torchrun (standalone, one node) sets for worker `rank` of `nproc`."""
    e = rank_env(rank, nproc, port, base)
    e.update({
        "GROUP_WORLD_SIZE": "1", "ROLE_WORLD_SIZE": str(nproc), "ROLE_NAME": "default",
        "TORCHELASTIC_RUN_ID": run_id, "TORCHELASTIC_RESTART_COUNT": "0", "TORCHELASTIC_MAX_RESTARTS": "0",
        "TORCHELASTIC_USE_AGENT_STORE": "True",  # torchrun's default (c10d rendezvous): the agent hosts the store
    })
    return e


# A fork server's way to start ranks (`simdist.script.zygote.Zygote.spawn`): [(environment,
# argv after the interpreter)] -> the forked processes, owned and ended like launched ones.
Spawn = Callable[[list[tuple[dict[str, str], list[str]]]], list[Child]]


@dataclass
class Launch:
    """The processes of one script run (and, on real Gloo, the store its ranks meet at)."""

    run_id: str
    procs: LocalProcesses = field(default_factory=LocalProcesses)
    store: Any = None  # gloo mode: the rendezvous store, kept alive for the whole run
    gen_store: Any = None  # gloo mode: where generations k > 1 meet their Gloo addresses (`env.GEN_STORE`)
    host: socket.socket | None = None  # gloo mode: holds the port of a rank-0-hosted store (`host_port`)
    near: list[socket.socket] = field(default_factory=list)  # torchrun-style: MASTER_PORT + k's stand-ins

    def done(self) -> bool:
        return self.procs.all_ended()

    def returncodes(self) -> list[int | None]:
        return [p.popen.poll() for p in self.procs.procs]


def base_env(socket_path: str, run_id: str, gpus: int, mode: str, batches: str | None = None) -> dict[str, str]:
    e = dict(os.environ)
    paths = [str(env.BOOTSTRAP_DIR)] + [p for p in e.get("PYTHONPATH", "").split(os.pathsep) if p]
    e.update({
        "PYTHONPATH": os.pathsep.join(paths),
        env.SOCKET: socket_path,
        env.RUN_ID: run_id,
        env.GPUS: str(gpus),
        env.MODE: mode,
    })
    e.pop(env.BATCHES, None)
    e.pop(env.RANK_PID, None)  # (a run started from a rank of another run: its processes claim their own)
    if batches:
        e[env.BATCHES] = batches
    if mode == env.GLOO:
        e.setdefault(FR_ENV, FR_BUFFER_SIZE)
        e.setdefault("GLOO_SOCKET_IFNAME", LOOPBACK_IFNAME)
    return e


def new_run_id() -> str:
    return uuid.uuid4().hex[:12]


def start(script: Path, args: Sequence[str], socket_path: str, *, nproc_per_node: int | None, gpus: int,
          stdout: int | IO | None = None, run_id: str | None = None, mode: str = env.SIM,
          batches: str | None = None, spawn: Spawn | None = None) -> Launch:
    """Start the script's processes; `spawn` (a fork server's) instead of a new interpreter
    for each (the processes' output then goes where the fork server's goes)."""
    run = Launch(run_id or new_run_id())
    try:
        common = base_env(socket_path, run.run_id, gpus, mode, batches)
        if mode == env.GLOO:  # the ranks reach it by env.STORE (`rank.patches`), not MASTER_PORT:
            run.store = loopback_store(nproc_per_node)  # both modes show the script torchrun's port
            common[env.STORE] = f"{LOOPBACK}:{int(run.store.port)}"
            run.gen_store = loopback_store(None)
            common[env.GEN_STORE] = f"{LOOPBACK}:{int(run.gen_store.port)}"
            run.host = host_port()
            common[env.HOST_PORT] = f"{LOOPBACK}:{run.host.getsockname()[1]}"
        if nproc_per_node is not None:
            run.near = near_ports(common)
        cmd = [sys.executable, str(script), *args]
        envs = [common] if nproc_per_node is None else [
            torchrun_env(r, nproc_per_node, run.run_id, TORCHRUN_PORT, common) for r in range(nproc_per_node)]
        if spawn is not None:
            for child in spawn([(e, cmd[1:]) for e in envs]):
                run.procs.adopt(child)
        for e in envs if spawn is None else ():
            run.procs.start(cmd, env=e, stdout=stdout)
    except BaseException:
        end(run)
        raise
    return run


def host_port() -> socket.socket:
    """A free port on 127.0.0.1 for a run's rank-0-hosted store (`env.HOST_PORT`), below the
    kernel's ephemeral range (the kernel never hands such a port to an outgoing connection),
    held for the run by the socket returned: bound with SO_REUSEADDR and never listening, it
    lets rank 0's TCPStore bind the port (torch's sockets, libuv's or its own, set
    SO_REUSEADDR too) while another run's `host_port`, which binds without it, cannot take
    the port between this pick and rank 0's bind (two concurrent runs would otherwise meet
    at one store, or fail with "address already in use"). `end` closes it."""
    try:
        low = int(Path("/proc/sys/net/ipv4/ip_local_port_range").read_text().split()[0])
    except (OSError, ValueError, IndexError):
        low = 32768
    ports = range(max(1024, min(low, 32768) - 12768), max(1025, min(low, 32768)))
    for port in random.sample(ports, min(200, len(ports))):
        s = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
        try:
            s.bind((LOOPBACK, port))  # without SO_REUSEADDR: fails on a port held or used by anyone
        except OSError:
            s.close()
            continue
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)  # from now on rank 0's bind may share it
        return s
    raise OSError("no free port on 127.0.0.1 for the run's store")


def near_ports(common: dict[str, str]) -> list[socket.socket]:
    """A port of the run's own for each of MASTER_PORT + 1 .. + NEAR_PORTS (`env.PORT_MAP`): real
    code hosts a second store there (`TCPStore(MASTER_ADDR, MASTER_PORT + 1, is_master=rank == 0)`:
    NVIDIA's in-process restart, NeMo), a real server on both sides (`rank.ownstore`). The shown
    MASTER_PORT is torchrun's 29500 for every run, so without them concurrent runs (CI's, the two
    sides of a compare) would all bind 29501: "address already in use"."""
    held = [host_port() for _ in range(NEAR_PORTS)]
    common[env.PORT_MAP] = ",".join(f"{TORCHRUN_PORT + k}:{s.getsockname()[1]}" for k, s in enumerate(held, 1))
    return held


def tagged_processes(run_id: str) -> list[int]:
    """Live processes (not zombies) whose environment carries this run's id."""
    return processes_with_env(env.RUN_ID, run_id)


def end(run: Launch, grace_s: float = 2.0) -> None:
    """Kill every process of the run (the launched sessions, then anything still tagged),
    reap the ones we started, and close the store."""
    run.procs.close()
    deadline = time.monotonic() + grace_s
    while (left := tagged_processes(run.run_id)) and time.monotonic() < deadline:
        for pid in left:
            try:
                os.kill(pid, signal.SIGKILL)
            except OSError:
                pass
        time.sleep(0.02)
    run.store = run.gen_store = None  # a store closes its socket when the last reference goes
    if run.host is not None:
        run.host.close()
        run.host = None
    for s in run.near:
        s.close()
    run.near = []
