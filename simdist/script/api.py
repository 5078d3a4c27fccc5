"""`run_script`: a user's torch.distributed script on simulated ranks, as one call."""

from __future__ import annotations

import ast
import os
import shutil
import socket
import tempfile
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import IO, Any

from simdist.check.classify import Verdict, judge
from simdist.check.waitfor import build_waitfor
from simdist.errors import ScriptError
from simdist.limits import LOCAL_RANKS, check_timeout
from simdist.network.cost import CostModel
from simdist.procs import Watchdog
from simdist.report import Report
from simdist.scenario import Topology, load_topology, topology_problems
from simdist.script import env, launch, workdir
from simdist.script.agent import Agent, ClockAgent
from simdist.script.build import Groups, build_report
from simdist.script.coordinator import Coordinator
from simdist.script.generations import memberships, merged_groups
from simdist.script.initwatch import InitWatch
from simdist.script.rank import visible_gpus
from simdist.script.ranks import per_process
from simdist.script.rendezvous import ended_without_init, left_words
from simdist.script.stalls import HANG_AFTER_S, StallRule, check_hang_after
from simdist.script.workdir import SetAside
from simdist.script.zygote import Zygote, runs

DEFAULT_GPUS = 8  # an 8-GPU node (DGX/HGX), the machine distributed training usually runs on
MAX_GPUS = 1024  # per node: far above any machine's; each simulated GPU has its own state in a rank
BACKENDS = ("gloo", "nccl")
Batches = str | int | Sequence[int] | None


def parse_caps(batches: Batches, nproc_per_node: int | None) -> list[int]:
    """`--batches` as a list of caps ([] for none); bad input raises ScriptError naming the field."""
    if batches is None:
        return []
    try:
        if isinstance(batches, str):
            caps = env.parse_batches(batches)
        else:
            caps = [int(batches)] if isinstance(batches, int) else [int(b) for b in batches]
            if not caps or any(c < 0 for c in caps):
                raise ValueError(f"expected non-negative batch counts, got {list(caps)}")
    except ValueError as e:
        raise ScriptError(f"batches: {e}") from None
    if nproc_per_node is not None and len(caps) not in (1, nproc_per_node):
        raise ScriptError(f"batches: {len(caps)} caps given ({env.format_batches(caps)}) for --nproc-per-node "
                          f"{nproc_per_node} (give one per rank, or one for every rank)")
    return caps


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


def default_gpus(nproc_per_node: int | None) -> int:
    """The GPUs of the simulated node when the user names none (`--gpus-per-node`): 8, or one
    per rank when torchrun starts more than 8, so that a script's `set_device(local_rank)`
    finds its GPU."""
    return max(DEFAULT_GPUS, nproc_per_node or 0)


def check_gpus(gpus: Any, field: str = "gpus") -> int:
    """A node's GPU count as given: a whole number from 0 (a CPU-only node: no simulated GPU,
    torch as installed) to MAX_GPUS; anything else raises ScriptError naming `field`. Fewer
    GPUs than the script's ranks is no bad input: on such a node `set_device(local_rank)`
    raises, the script's own error."""
    if isinstance(gpus, bool) or not isinstance(gpus, int) or not 0 <= gpus <= MAX_GPUS:
        raise ScriptError(f"{field}: must be a whole number of GPUs from 0 (a CPU-only node) to {MAX_GPUS}, "
                          f"got {gpus!r}")
    return gpus


Topo = str | os.PathLike | Topology | None


def cost_factory(topology: Topology | None) -> Callable[[int], CostModel]:
    """The cost model for a world size, made once the ranks say how many they are: the given
    topology's (`--topology`), else the default one (docs/cost-model.md), as for a scenario
    without a [topology] table. A topology that cannot hold the world raises, naming the field."""
    topo = topology or Topology()

    def make(world_size: int) -> CostModel:
        problems = topology_problems(topo, world_size)
        if problems:
            raise ScriptError("; ".join(problems))
        return CostModel.from_scenario_topology(topo, world_size)

    return make


@dataclass
class ScriptRun:
    """A finished run: its report, plus what only the coordinator knew (the groups' members
    for the wait-for graph; per rank, the longest DataLoader epoch and how many epochs a
    `--batches` cap ended early, which tell the fuzzer which caps mean something)."""

    report: Report
    groups: dict[str, list[int]] = field(default_factory=dict)
    longest_epoch: list[int] = field(default_factory=list)
    capped: list[int] = field(default_factory=list)
    interrupted: bool = False  # Ctrl-C ended it (`execute`'s `status`): the report is the run as it stood
    written: frozenset[str] = frozenset()  # absolute paths the run's processes wrote (`rank.writes`)

    def verdict(self) -> Verdict:
        """The checker's verdict, as for a scenario without [expect]: failed when the run did
        not complete or a finding was made (the report carries its findings already)."""
        return judge(self.report, list(self.report.findings), build_waitfor(self.report, Groups(self.groups)))


def run_script(path: str | os.PathLike, args: Sequence[str] = (), *, nproc_per_node: int | None = None,
               backend: str | None = None, timeout_s: float = 120.0, gpus: int | None = None,
               measure_compute: bool = True, stdout: int | IO | None = None, run_id: str | None = None,
               mode: str = env.SIM, batches: Batches = None, zygote: Zygote | None = None,
               topology: Topo = None, hang_after_s: float | None = HANG_AFTER_S) -> Report:
    """Run the script on simulated ranks and report what every rank did.

    `nproc_per_node`: start that many ranks as torchrun would; None runs the script as-is
    (it starts its own ranks). `backend`: "gloo" or "nccl" semantics for peers that exit
    (default: what the script asks for). `timeout_s`: watchdog: how long the ranks may go
    without communicating (start-up not counted) before the run is reported as a timeout.
    `measure_compute=False` makes every time in the report deterministic.
    `stdout`: where the script's own output goes (default: this process's stdout).
    `run_id`: the tag every process of the run carries (`launch.tagged_processes` finds them).
    `mode="gloo"`: the same launcher and capture with real Gloo process groups instead of
    simulated ones (source "real"; the trace from the Flight Recorder), for comparison.
    `batches`: cap on the batches each rank's DataLoaders yield per epoch (one per rank, or
    one for every rank; "5,6" or [5, 6] or 5), honoured the same way in both modes
    (`simdist.script.rank.batches`); each rank's batches yielded are its `inputs_processed`.
    `zygote`: a fork server for this script (or any script) and mode (`simdist.script.zygote`)
    that forks the ranks instead of starting an interpreter for each (output goes where the
    zygote's goes; the simulated GPU count is the zygote's, and `gpus`, if given, must be it).
    `gpus`: the GPUs of the node the ranks run on (`--gpus-per-node`; default `default_gpus`):
    0 is a CPU-only node, where the script sees this host's torch with no GPU shim at all.
    `topology`: the network the cost model times communication on: a preset name, a TOML
    file with a [topology] table (as a scenario's), or a `Topology` (default: loopback).
    `hang_after_s` (`mode="gloo"`): a hang is reported once every live rank has been stalled
    in a torch.distributed wait for this long (`simdist.script.stalls`), not only when the
    watchdog fires; None or 0: the watchdog alone. The simulator proves its hangs at once.
    """
    return execute(path, args, nproc_per_node=nproc_per_node, backend=backend, timeout_s=timeout_s, gpus=gpus,
                   measure_compute=measure_compute, stdout=stdout, run_id=run_id, mode=mode, batches=batches,
                   zygote=zygote, topology=topology, hang_after_s=hang_after_s).report


def _validated(script: Path, backend: str | None, mode: str, nproc_per_node: int | None, batches: Batches,
               zygote: Zygote | None) -> tuple[str | None, list[int]]:
    """Bad input found before any process starts (one line naming the field); the backend
    semantics to use and the caps."""
    check_script(script)
    if backend is not None and backend not in BACKENDS:
        raise ScriptError(f"backend: must be one of {', '.join(BACKENDS)}, got {backend!r}")
    if mode not in (env.SIM, env.GLOO):
        raise ScriptError(f"mode: must be {env.SIM} or {env.GLOO}, got {mode!r}")
    if nproc_per_node is not None and nproc_per_node < 1:
        raise ScriptError(f"nproc_per_node: must be >= 1, got {nproc_per_node}")
    if nproc_per_node is not None:
        LOCAL_RANKS.check(nproc_per_node, "nproc_per_node", f"{nproc_per_node:,} rank processes")
    if zygote is not None and not runs(zygote, script, mode):
        raise ScriptError(f"zygote: a fork server for {zygote.script or 'scripts'} ({zygote.mode}) cannot run "
                          f"{script} ({mode})")
    return ("gloo" if mode == env.GLOO else backend), parse_caps(batches, nproc_per_node)


def _refuse_unsupported(report: Report, gpus: bool) -> None:
    """A script that calls an operation the simulated backend cannot model is bad input for
    the simulator (what follows on the other ranks would be the simulator's artefact, not
    the program's): one line naming the operation, the rank and the user's line. (`gpus`
    False: CUDA's absence is the CPU-only node's, its error the program's own.)"""
    for r in report.ranks:
        what = env.unsupported_in(r.error.message, gpus) if r.error is not None else None
        if what is not None:
            at = f" at {r.location.short()}" if r.location is not None else ""
            raise ScriptError(f"script: {env.UNSUPPORTED.format(what).removeprefix('simdist: ')} (rank {r.rank}{at})")


# what a process that reads torchrun's environment raises without it: a KeyError naming one
# of its variables (`os.environ["LOCAL_RANK"]`), or torch's env:// rendezvous error
_TORCHRUN_VARS = ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                  "GROUP_RANK", "TORCHELASTIC_RUN_ID")


def _wants_torchrun(x: dict[str, Any]) -> bool:
    error = x.get("error") or {}
    message = str(error.get("message", ""))
    return (error.get("type") == "KeyError" and message.strip("'\"") in _TORCHRUN_VARS) or \
        "env:// rendezvous: environment variable" in message


def _hidden_gpus(gpus: int) -> list[str]:
    """The note of an exported CUDA_VISIBLE_DEVICES that hides some of the node's `gpus`
    simulated GPUs from every rank (`visible_gpus.hidden_note`): it may size the world."""
    note = visible_gpus.hidden_note(gpus)
    return [] if note is None else [note]


def never_initialised(script: Path, coord: Coordinator, codes: list[int | None], nproc_per_node: int | None,
                      gpus: int = 0) -> str:
    """Why a run never had a process group, in one line: which process ended how and where
    (each process's report, `rank.exits`: the error's line and the user's file:line; an init
    that was called and raised says so), and the advice that fits. A script run as-is whose
    own process failed for want of torchrun's variables is told to give --nproc-per-node; one
    that starts its own ranks (mp.spawn) is not: the fix is in the script. An exported
    CUDA_VISIBLE_DEVICES that hides the node's `gpus` simulated GPUs is said (a script that
    spawns one rank a GPU it sees spawns none)."""
    said: dict[str, list[str]] = {}
    for r, x in sorted(coord.no_init.items()):
        said.setdefault(ended_without_init(x, at=True), []).append(str(r))
    parts = [f"rank(s) {', '.join(rs)}: {words}" for words, rs in said.items()]
    spawned = sorted((x for x in coord.spawn_left if x.get("spawn") is not None), key=lambda x: x["spawn"])
    own = [x for x in coord.spawn_left if x.get("spawn") is None]
    # (the script's own process re-raises its children's error from mp.spawn's join: said once, by the child)
    parts += [left_words(x) for x in spawned or own]
    what = "; ".join(parts) if parts else "no process called init_process_group"
    errors = any(x.get("error") for x in [*coord.no_init.values(), *(x["never"] for x in coord.spawn_left)])
    if nproc_per_node is None and not spawned and any(codes) and (
            not own or any(_wants_torchrun(x["never"]) for x in own)):
        hint = (f"; it ran as `python {script.name}` because --nproc-per-node was not given: "
                "a script that torchrun starts needs --nproc-per-node N")
    elif spawned and errors:
        hint = ("; the script starts its own ranks (mp.spawn), so --nproc-per-node does not apply: the error is the "
                "script's own (its traceback is in the script's output above)")
    elif errors:
        hint = "; the error is the script's own (its traceback is in the script's output above)"
    else:
        hint = ""
    hint += "".join(f"; {note}" for note in _hidden_gpus(gpus))
    return f"script: {script} never initialised a process group: {what} (exit codes {codes}){hint}"


def execute(path: str | os.PathLike, args: Sequence[str] = (), *, nproc_per_node: int | None = None,
            backend: str | None = None, timeout_s: float = 120.0, gpus: int | None = None,
            measure_compute: bool = True, stdout: int | IO | None = None, run_id: str | None = None,
            mode: str = env.SIM, batches: Batches = None, zygote: Zygote | None = None,
            topology: Topo = None, hang_after_s: float | None = HANG_AFTER_S,
            status: Callable[[str], None] | None = None) -> ScriptRun:
    """`run_script` with what the coordinator knew besides the report (see `ScriptRun`).
    `status`: where a line goes while the ranks wait in init (or a group's members in
    new_group) for ranks that do not come
    (`simdist.script.initwatch`; the CLI's stderr); given, Ctrl-C ends the run with its report
    (`ScriptRun.interrupted`) instead of raising KeyboardInterrupt."""
    check_timeout(timeout_s, "timeout_s")
    settle = check_hang_after(hang_after_s, "hang_after_s")
    stalls = StallRule(settle, timeout_s) if settle is not None and mode == env.GLOO else None
    script = Path(path)
    backend, caps = _validated(script, backend, mode, nproc_per_node, batches, zygote)
    topo = topology if topology is None or isinstance(topology, Topology) else load_topology(topology)
    gpus = check_gpus(gpus if gpus is not None else zygote.gpus if zygote is not None else default_gpus(nproc_per_node))
    if zygote is not None and gpus != zygote.gpus:
        raise ScriptError(f"gpus: {gpus} asked for, but the zygote simulates {zygote.gpus}")
    tmp = tempfile.mkdtemp(prefix="simdist-")
    listener = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    listener.bind(os.path.join(tmp, "coordinator.sock"))
    listener.listen(256)
    listener.setblocking(False)
    coord = Coordinator(listener, cost_factory(topo), backend=backend, measure_compute=measure_compute, batches=caps,
                        stalls=stalls, rendezvous=mode == env.SIM)
    run: launch.Launch | None = None
    agent: Agent | None = None
    t0 = time.time()
    try:
        run = launch.start(script, list(args), listener.getsockname(), nproc_per_node=nproc_per_node,
                           gpus=gpus, stdout=stdout, run_id=run_id, mode=mode,
                           batches=env.format_batches(caps) if caps else None,
                           spawn=zygote.spawn if zygote is not None else None)
        coord.init_watch = InitWatch(run.run_id, lambda: [p.pid for p in started.procs.procs],
                                     StallRule(settle, timeout_s) if settle is not None and mode == env.SIM else None,
                                     status)
        started = run  # torchrun-style: process r is rank r, so one that ended will never join (`rendezvous`)
        ended = None if nproc_per_node is None else (
            lambda: {r for r, code in enumerate(started.returncodes()) if code is not None})
        agent = None if nproc_per_node is None or mode != env.GLOO else Agent(run.procs.procs, coord)  # torchrun's agent's SIGTERMs
        done = run.done if nproc_per_node is None else agent.poll if agent is not None else ClockAgent(
            run.procs.procs, coord).poll  # (simulated: the report's side is `build`)
        ending = coord.serve(done, Watchdog(timeout_s), exits=zygote, ended=ended)
        if ending.kind == "timeout" or (mode == env.GLOO and ending.kind in ("hang", "interrupted")):
            # what each real rank recorded, and where each rank that blocks in no operation
            # stands (its last operation is not where it is), before `launch.end` kills them
            coord.collect_records()
    finally:
        if run is not None:
            launch.end(run)
        coord.close()
        listener.close()
        refused = env.refusal(tmp)  # every process has ended (`launch.end`)
        written = env.written(tmp)
        shutil.rmtree(tmp, ignore_errors=True)
    if refused is not None:
        raise ScriptError(refused)
    if coord.input_error is not None:
        raise ScriptError(coord.input_error)
    if not coord.gens and ending.kind == "interrupted":  # Ctrl-C before any rank came: nothing to report
        raise KeyboardInterrupt
    if not coord.gens:
        raise ScriptError(never_initialised(script, coord, run.returncodes() if run is not None else [],
                                            nproc_per_node, gpus))
    timings = {"wall_s": round(time.time() - t0, 4)}
    if agent is not None and agent.record_wait_s is not None:  # its SIGTERM's delay for the records
        timings["agent_record_wait_s"] = round(agent.record_wait_s, 4)
    if ending.kind == "hang" and ending.last_blocked is not None:
        timings["hang_detect_s"] = round(ending.at - ending.last_blocked, 4)
    codes = run.returncodes() if run is not None and nproc_per_node is not None else []  # index = rank
    report = build_report(coord, ending, script.name, codes, timings, real=mode == env.GLOO)
    _refuse_unsupported(report, gpus > 0)
    report.notes += _hidden_gpus(gpus)
    if ending.kind == "hang" and ending.last_blocked is not None:
        report.timings["hang_report_s"] = round(time.time() - ending.last_blocked, 4)
    members = [memberships(coord.gens, r) for r in range(coord.world_size)]
    return ScriptRun(report, merged_groups(coord.gens), [max((c.longest_epoch for c in m), default=0) for m in members],
                     [per_process(m, lambda c: c.capped) for m in members], ending.kind == "interrupted", written)


@dataclass
class ScriptComparison:
    """Both sides of `simdist compare` for a script, and what was done so that the real side
    started from the working directory the simulated one found (`simdist.script.workdir`).
    Ctrl-C (with `status`): the side it ended is its report as it stood (`ScriptRun.interrupted`);
    a side it kept from starting, or ended before any rank came, is None."""

    sim: ScriptRun
    real: ScriptRun | None
    workdir: SetAside

    @property
    def interrupted(self) -> bool:
        return self.sim.interrupted or self.real is None or self.real.interrupted


SIDES = {env.SIM: "simulated side", env.GLOO: "real side"}  # how status lines name the side they come from


def _sided(line: str, side: str) -> str:
    """A status line ("init: waiting ...") with the side it comes from after its subject."""
    subject, _, rest = line.partition(": ")
    return f"{subject}: {side}: {rest}"


def compare_script(path: str | os.PathLike, args: Sequence[str] = (), *,
                   zygotes: Callable[[str], Zygote] | None = None,
                   status: Callable[[str], None] | None = None, **kw: Any) -> ScriptComparison:
    """The script on simulated ranks, then on real Gloo (`execute`'s arguments, `backend`
    gloo), each side from the same files: what the simulated side's processes wrote in the
    working directory (`ScriptRun.written`) is set aside before the real side starts; what
    anything else changed meanwhile is left alone. `zygotes(mode)`: a fork server per
    mode (the tests'), else the plain launch. `status`: each side's status lines, named by
    side after their subject ("init: real side: waiting ...", `execute`); given, Ctrl-C ends
    the comparison with what each side had (a simulated side it ended: no real side follows)."""
    def side(mode: str) -> ScriptRun:
        said = None if status is None else (lambda line: status(_sided(line, SIDES[mode])))
        return execute(path, args, **kw, mode=mode, zygote=zygotes(mode) if zygotes else None, status=said)

    before = workdir.record()
    try:
        sim = side(env.SIM)
    except BaseException:  # no real side follows: the files stay as the simulated side left them
        before.discard()
        raise
    if sim.interrupted:
        before.discard()
        return ScriptComparison(sim, None, SetAside())
    moved = workdir.set_aside(before, written=sim.written)
    try:
        real = side(env.GLOO)
    except KeyboardInterrupt:  # before any real rank came: the simulated side's report still stands
        if status is None:
            raise
        real = None
    return ScriptComparison(sim, real, moved)
