"""`run_script`: a user's torch.distributed script on simulated ranks, as one call."""

from __future__ import annotations

import ast
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import IO

from simdist.errors import ScriptError
from simdist.limits import check_timeout
from simdist.network.cost import CostModel
from simdist.report import Report
from simdist.scenario import Topology
from simdist.script import env, launch
from simdist.script.build import build_report
from simdist.script.coordinator import Coordinator

DEFAULT_GPUS = 8
BACKENDS = ("gloo", "nccl")


def check_script(path: Path) -> None:
    """A script that does not exist or does not parse is bad input, found before any process starts."""
    if not path.is_file():
        raise ScriptError(f"script: {path} does not exist")
    try:
        ast.parse(path.read_text(encoding="utf-8"), filename=str(path))
    except SyntaxError as e:
        raise ScriptError(f"script: {path} does not parse: {e.msg} (line {e.lineno})") from None
    except (OSError, UnicodeDecodeError) as e:
        raise ScriptError(f"script: cannot read {path}: {e}") from None


def default_cost(world_size: int) -> CostModel:
    """The default topology's cost model (docs/cost-model.md), as for a scenario without one."""
    return CostModel.from_scenario_topology(Topology(), world_size)


def run_script(path: str | os.PathLike, args: Sequence[str] = (), *, nproc_per_node: int | None = None,
               backend: str | None = None, timeout_s: float = 120.0, gpus: int | None = None,
               measure_compute: bool = True, stdout: int | IO | None = None, run_id: str | None = None,
               mode: str = env.SIM) -> Report:
    """Run the script on simulated ranks and report what every rank did.

    `nproc_per_node`: start that many ranks as torchrun would; None runs the script as-is
    (it starts its own ranks). `backend`: "gloo" or "nccl" semantics for peers that exit
    (default: what the script asks for). `timeout_s`: watchdog for ranks that never block
    nor finish. `measure_compute=False` makes every time in the report deterministic.
    `stdout`: where the script's own output goes (default: this process's stdout).
    `run_id`: the tag every process of the run carries (`launch.tagged_processes` finds them).
    `mode="gloo"`: the same launcher and capture with real Gloo process groups instead of
    simulated ones (source "real"; printed lines and exits, no trace yet), for comparison.
    """
    script = Path(path)
    check_script(script)
    if backend is not None and backend not in BACKENDS:
        raise ScriptError(f"backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if mode not in (env.SIM, env.GLOO):
        raise ScriptError(f"mode: must be {env.SIM} or {env.GLOO}, got {mode!r}")
    if mode == env.GLOO:
        backend = "gloo"
    if nproc_per_node is not None and nproc_per_node < 1:
        raise ScriptError(f"nproc_per_node: must be >= 1, got {nproc_per_node}")
    check_timeout(timeout_s, "timeout_s")
    tmp = tempfile.mkdtemp(prefix="simdist-")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(tmp, "coordinator.sock"))
    listener.listen(256)
    listener.setblocking(False)
    coord = Coordinator(listener, default_cost, backend=backend, measure_compute=measure_compute)
    run: launch.Launch | None = None
    t0 = time.time()
    try:
        run = launch.start(script, list(args), listener.getsockname(), nproc_per_node=nproc_per_node,
                           gpus=gpus or max(DEFAULT_GPUS, nproc_per_node or 0), stdout=stdout,
                           run_id=run_id, mode=mode)
        ending = coord.serve(run.done, time.monotonic() + timeout_s)
    finally:
        if run is not None:
            launch.end(run)
        coord.close()
        listener.close()
        shutil.rmtree(tmp, ignore_errors=True)
    if coord.engine is None:
        codes = run.returncodes() if run is not None else []
        raise ScriptError(f"script: {script} never initialised a process group (no rank called "
                          f"init_process_group; exit codes {codes})")
    timings = {"wall_s": round(time.time() - t0, 4)}
    if ending.kind == "hang" and ending.last_blocked is not None:
        timings["hang_detect_s"] = round(ending.at - ending.last_blocked, 4)
    codes = run.returncodes() if run is not None and nproc_per_node is not None else []  # index = rank
    report = build_report(coord, ending, script.name, codes, timings, real=mode == env.GLOO)
    if ending.kind == "hang" and ending.last_blocked is not None:
        report.timings["hang_report_s"] = round(time.time() - ending.last_blocked, 4)
    return report
