"""How a real-backend worker process starts: as a fresh interpreter, or forked by a zygote.

`real_backend.launch` starts one worker per rank, ``python -m real_backend.worker SCENARIO
--out DIR --control stdin`` with the environment `worker_env` makes, its stdin a pipe (the
control channel) and its stdout/stderr the rank's log. `start_worker` does that, either
with a new interpreter (the default: what `simdist real` does for users) or through a
`WorkerZygote`, a fork server (`simdist.forkserver`) with torch and the worker's modules
imported once (`real_backend.zygote`): a caller that runs many real runs (the test suite,
`simdist compare` on several files) then pays an interpreter start and `import torch`
(~2 CPU seconds per rank) once instead of per rank. The forked worker gets the same
argv, environment, working directory, stdin pipe and log as the launched one, leads its own
session and is reaped, killed and watched by the launcher like one (`LocalProcesses.adopt`).

What a process reads only at its start cannot differ per request, so the zygote starts
with the environment every worker shares (`worker_base_env`: PYTHONPATH, unbuffered output,
OMP_NUM_THREADS, which OpenMP reads when torch loads it; the zygote re-applies a request's
own OMP_NUM_THREADS). What torch reads from the environment for a rank (the Flight
Recorder's TORCH_FR_BUFFER_SIZE and dump path, GLOO_SOCKET_IFNAME, the rendezvous,
TORCHELASTIC_ERROR_FILE, TORCH_WORKER_SERVER_SOCKET) it reads when the process group is
made or the file is written, after the fork, so each forked rank sees its own request's.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path
from typing import IO

from real_backend.record import FR_BUFFER_SIZE, FR_ENV
from simdist.flightrec.format import fr_env
from simdist.forkserver import ForkServer
from simdist.procs import LocalProcess, LocalProcesses, rank_env, with_pythonpath

REPO_ROOT = Path(__file__).resolve().parents[1]
WORKER_MODULE = "real_backend.worker"
ZYGOTE_MODULE = "real_backend.zygote"


def worker_base_env() -> dict[str, str]:
    """A worker's environment but for its rank and rendezvous (what the zygote starts with):
    this process's environment, the package on PYTHONPATH, `rank_env`'s settings, the FR buffer."""
    env = with_pythonpath(rank_env(0, 1, 0), REPO_ROOT)
    env[FR_ENV] = env.get(FR_ENV) or FR_BUFFER_SIZE
    return env


def worker_env(rank: int, world_size: int, port: int, fr_dumps: Path | None, fr_on_demand: bool) -> dict[str, str]:
    env = rank_env(rank, world_size, port, base=worker_base_env())
    env["SIMDIST_HOSTED_STORE"] = "1"  # the worker connects to the launcher's store
    if fr_dumps is not None:
        env.update(fr_env(fr_dumps, rank, fr_on_demand))
    return env


class WorkerZygote(ForkServer):
    """A fork server for real-backend workers; pass it to `run_real(..., zygote=...)`, and
    `close` it (or use it as a context manager) when done. Its own output (nothing, unless
    it fails to start) goes to `stdout`/`stderr`; each worker's goes to its rank's log."""

    def __init__(self, *, stdout: int | IO | None = subprocess.DEVNULL, stderr: int | IO | None = None):
        super().__init__(ZYGOTE_MODULE, [], env=worker_base_env(), owner=LocalProcesses(), cwd=REPO_ROOT,
                         stdin=subprocess.DEVNULL, stdout=stdout, stderr=stderr)

    def __enter__(self) -> WorkerZygote:
        return self


def start_worker(procs: LocalProcesses, args: list[str], env: dict[str, str], log: IO[bytes],
                 zygote: WorkerZygote | None = None) -> LocalProcess:
    """Start ``python -m real_backend.worker ARGS`` (stdin: a pipe for `LocalProcess.tell`;
    stdout and stderr: `log`) as a process of `procs`, forked by `zygote` when one is given."""
    if zygote is None:
        return procs.start([sys.executable, "-m", WORKER_MODULE, *args], env=env, cwd=REPO_ROOT,
                           stdin=subprocess.PIPE, stdout=log, stderr=subprocess.STDOUT)
    r, w = os.pipe()
    stdin = open(w, "wb")  # noqa: SIM115 - the forked process's stdin; LocalProcesses.close closes it
    try:
        child = zygote.fork({"env": env, "argv": [WORKER_MODULE, *args], "cwd": str(REPO_ROOT)},
                            stdio={0: r, 1: log.fileno(), 2: log.fileno()}, stdin=stdin)
    except BaseException:
        stdin.close()
        raise
    finally:
        os.close(r)
    return procs.adopt(child)
