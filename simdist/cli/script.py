"""A user's torch.distributed script wherever a scenario goes: `run`, `check`, `real`, `compare`.

One interface for both kinds of input: these commands take scenario files (.toml) or one
script (.py) followed by its own arguments (after `--`), and `simdist.cli.scenario` hands a
script over to the functions here. The options below apply to scripts only; a scenario
given one is bad input (`reject_for_scenario`). A script is judged by the same rule as a
scenario without `[expect]` (`simdist.expect.judge`): exit 0 when the checker finds nothing
(the run completed, no mismatch, no rank failed), 1 when it fails; `compare` exits 0 when
the simulator and real Gloo agree, 4 when they differ only by a race of the real run
(`simdist.races`, each race said: not a model difference), 1 otherwise. Bad input is one
line and exit 2, Ctrl-C exit 130.

`real` and `compare` run the script on real Gloo (CPU) under the same launcher, so both
sides run the same file unmodified; the simulated side of `compare` takes Gloo's semantics
for ranks that exit, whatever backend the script names.
"""

from __future__ import annotations

import sys
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from simdist.cli.console import ExitCode, bad_input, check_output_file, err, exit_on, exit_with, say, write_output
from simdist.cli.reports import Compared, print_report, say_judgement
from simdist.errors import ScriptError
from simdist.expect import judge
from simdist.jsonout import write_json
from simdist.script.stalls import EARLY, HANG_AFTER_S, WATCHDOG, check_hang_after

NprocOpt = Annotated[int | None, typer.Option(
    "--nproc-per-node", help="script: start N ranks as torchrun would (default: the script starts its own)")]
GpusOpt = Annotated[str | None, typer.Option(
    "--gpus-per-node", metavar="N", help="script: the GPUs of the node the ranks run on, as torchrun's --nproc-per-node "
                            "counts ranks; 0: a CPU-only node, where the script sees this host's torch with no "
                            "simulated GPU (torch.cuda.is_available() False), on both sides of compare "
                            "(default: 8, an 8-GPU node; one per rank above 8 ranks)")]
BackendOpt = Annotated[str | None, typer.Option(
    "--backend", help="script: gloo or nccl semantics for ranks that exit (default: what the script asks for)")]
BatchesOpt = Annotated[str | None, typer.Option(
    "--batches", help="script: cap on the batches each rank's DataLoaders yield per epoch, one per rank (5,6) "
                      "or one for every rank (5)")]
RealBackendOpt = Annotated[str | None, typer.Option(
    "--backend", help="script: real and compare run on Gloo (CPU) whatever the script names; gloo is the only "
                      "value")]
TimeoutOpt = Annotated[float | None, typer.Option(
    "--timeout", help="script: watchdog seconds without communication before the run counts as a timeout "
                      "(default 300)")]
HangAfterOpt = Annotated[float | None, typer.Option(
    "--hang-after", help="script, real Gloo: report a hang once every live rank has been blocked in a "
                         "torch.distributed wait, with no CPU used and no operation completed, for this many "
                         "seconds (default 3; 0: only the --timeout watchdog ends a hung run)")]
TopologyOpt = Annotated[str | None, typer.Option(
    "--topology", help="script: the network communication is timed on: a preset (loopback, switch8, two_nodes, "
                       "ring) or a TOML file with a [topology] table as in a scenario (default: loopback)")]
ZeroComputeOpt = Annotated[bool, typer.Option(
    "--zero-compute", help="script: count the ranks' own compute as 0 s, so every time in the report is a "
                           "function of the program (default: measured CPU time)")]

DEFAULT_TIMEOUT_S = 300.0


def is_script(path: str | Path) -> bool:
    return Path(path).suffix == ".py"


@dataclass(frozen=True)
class ScriptInput:
    """A script, its own arguments and the script options of one command."""

    path: Path
    args: tuple[str, ...] = ()
    nproc_per_node: int | None = None
    backend: str | None = None
    batches: str | None = None
    timeout: float | None = None
    zero_compute: bool = False
    topology: str | None = None
    hang_after: float | None = None  # real Gloo: the stall rule's settle period (None: its default)
    gpus_per_node: str | None = None  # as given; `gpus` reads it

    @property
    def gpus(self) -> int | None:
        """--gpus-per-node as a count (None: the default); bad input raises ScriptError naming it."""
        from simdist.script.api import check_gpus

        if self.gpus_per_node is None:
            return None
        try:
            n = int(self.gpus_per_node)
        except ValueError:
            n = self.gpus_per_node  # (refused below, as given)
        return check_gpus(n, "--gpus-per-node")

    @property
    def hang_after_s(self) -> float | None:
        return HANG_AFTER_S if self.hang_after is None else self.hang_after

    def execute(self, *, real: bool = False, json_: bool = False) -> Any:
        """Run it in the simulator (or on real Gloo); the script's own output goes to the
        terminal (stderr with --json, so stdout stays machine-readable). A `ScriptRun`."""
        from simdist.script.api import execute
        from simdist.script.env import GLOO, SIM

        return execute(self.path, self.args, nproc_per_node=self.nproc_per_node, backend=self.backend, gpus=self.gpus,
                       timeout_s=self.timeout or DEFAULT_TIMEOUT_S, measure_compute=not self.zero_compute,
                       stdout=sys.stderr.fileno() if json_ else None, mode=GLOO if real else SIM,
                       batches=self.batches, topology=self.topology, hang_after_s=self.hang_after_s,
                       status=_status)


def _status(line: str) -> None:
    """A status line of a run whose ranks wait in init or new_group (`simdist.script.initwatch`),
    on stderr, its subject ("init:", "new_group:"; `compare`'s side first) in colour."""
    subject, _, rest = line.partition(": ")
    say((f"{subject}:", "yellow"), f" {rest}", console=err)


def reject_for_scenario(*, nproc_per_node: int | None = None, backend: str | None = None,
                        timeout: float | None = None, batches: str | None = None, zero_compute: bool = False,
                        topology: str | None = None, hang_after: float | None = None,
                        script_args: list[str] | None = None, gpus_per_node: str | None = None) -> None:
    """A scenario takes none of the script options (its file says all): say so instead of
    ignoring them."""
    given = [name for name, v in (("--nproc-per-node", nproc_per_node), ("--backend", backend),
                                  ("--timeout", timeout), ("--batches", batches), ("--zero-compute", zero_compute),
                                  ("--topology", topology), ("--hang-after", hang_after is not None),
                                  ("--gpus-per-node", gpus_per_node is not None),
                                  ("script arguments", script_args)) if v]
    if given:
        raise ScriptError(f"{', '.join(given)}: only for a script (.py), not a scenario")


def _gloo_only(inp: ScriptInput, command: str) -> ScriptInput:
    """`real` and `compare` run on Gloo: a script's nccl becomes gloo there, `--backend nccl` is refused;
    a bad `--hang-after` is refused before anything runs."""
    if inp.backend not in (None, "gloo"):
        raise ScriptError(f"--backend: {command} runs the script on real Gloo; got {inp.backend!r}")
    check_hang_after(inp.hang_after)
    _ = inp.gpus  # a bad --gpus-per-node, before anything runs
    return replace(inp, backend="gloo")


def _judge_and_exit(run: Any, verdict: Any, json_: bool, extra: dict[str, Any] | None = None) -> NoReturn:
    """Exit 0 when the run passes (`simdist.expect.judge` without [expect]), else 1."""
    j = judge(run.report, None, verdict)
    if json_:
        doc = run.report.to_jsonable() if extra is None else {**extra, "passed": j.passed, "judged_by": j.by,
                                                               "report": run.report.to_jsonable()}
        write_json(doc, sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        say_judgement(j, verdict)
    if getattr(run, "interrupted", False):  # Ctrl-C: the report above is the run as it stood
        exit_with(ExitCode.INTERRUPTED)
    exit_on(j.passed)


def run_command(inp: ScriptInput, json_: bool, trace_out: Path | None) -> NoReturn:
    """`simdist run SCRIPT.py`: the script on simulated ranks, its report, judged."""
    from simdist.chrome_trace import write_chrome_trace

    with bad_input():
        check_output_file(trace_out, "trace-out")
        run = inp.execute(json_=json_)
    if trace_out is not None and not write_output(lambda: write_chrome_trace(run.report, trace_out), trace_out,
                                                  "trace-out"):
        raise typer.Exit(2)
    if not json_:
        print_report(run.report)
    _judge_and_exit(run, run.verdict(), json_)


def real_command(inp: ScriptInput, json_: bool) -> NoReturn:
    """`simdist real SCRIPT.py`: the script on real Gloo ranks (CPU), its report, judged."""
    with bad_input():
        run = _gloo_only(inp, "real").execute(real=True, json_=json_)
    if not json_:
        print_report(run.report)
    _judge_and_exit(run, run.verdict(), json_)


def compare_command(inp: ScriptInput, json_: bool) -> NoReturn:
    """`simdist compare SCRIPT.py`: simulated and real Gloo runs, diffed rank by rank, each
    from the same files (what the simulated side wrote is set aside first, and said where)."""
    from simdist.script.api import compare_script
    from simdist.script.env import GLOO

    with bad_input():
        inp = _gloo_only(inp, "compare")
        both = compare_script(inp.path, inp.args, nproc_per_node=inp.nproc_per_node, backend=GLOO, gpus=inp.gpus,
                              timeout_s=inp.timeout or DEFAULT_TIMEOUT_S, measure_compute=not inp.zero_compute,
                              stdout=sys.stderr.fileno() if json_ else None, batches=inp.batches,
                              topology=inp.topology, hang_after_s=inp.hang_after_s, status=_status)
    if both.interrupted:
        _compare_interrupted(both, json_)
    sim, real = both.sim.report, both.real.report
    compared = Compared.of(sim, real)
    if json_:
        write_json({**compared.jsonable(), "workdir": both.workdir.to_jsonable(), "sim": sim.to_jsonable(),
                    "real": real.to_jsonable()}, sys.stdout, indent=None, default=str)
        sys.stdout.write("\n")
    else:
        compared.say()
        for note in real.notes:  # a hung real side: which rule ended it, the early one or the watchdog
            if note.startswith((EARLY, WATCHDOG)):
                say(f"real side: {note}")
        for line in both.workdir.lines():
            say(line)
    exit_with(compared.code)


def _compare_interrupted(both: Any, json_: bool) -> NoReturn:
    """Ctrl-C during `compare`: no comparison (a side cut short would differ for that alone),
    but each side's report as it stood, the one never started or ended before any rank came
    said so, and exit 130."""
    sides = (("simulated side", both.sim), ("real side", both.real))
    if json_:
        write_json({"interrupted": True, "workdir": both.workdir.to_jsonable(),
                    **{k: (run.report.to_jsonable() if run is not None else None)
                       for k, (_, run) in zip(("sim", "real"), sides, strict=True)}},
                   sys.stdout, indent=None, default=str)
        sys.stdout.write("\n")
    else:
        for name, run in sides:
            if run is None:
                say((f"{name}:", "bold"), " not run" if both.sim.interrupted else " interrupted before any rank came")
                continue
            say((f"{name}:", "bold"), " interrupted (Ctrl-C): its report as it stood" if run.interrupted
                else " finished")
            print_report(run.report)
        for line in both.workdir.lines():
            say(line)
    exit_with(ExitCode.INTERRUPTED)


def check_command(inp: ScriptInput, json_: bool, graph: Path | None) -> NoReturn:
    """`simdist check SCRIPT.py`: the checker's verdict, explanation and wait-for graph."""
    from simdist.check.drawing import check_graph_path, to_dot, write_graph

    with bad_input():
        check_output_file(graph, "graph")
        if graph is not None:
            check_graph_path(graph)
        run = inp.execute(json_=json_)
    verdict = run.verdict()
    title = f"{inp.path.name}: wait-for graph"
    if graph is not None and not write_output(lambda: write_graph(verdict.waitfor, graph, title), graph, "graph"):
        raise typer.Exit(2)
    if not json_:
        say((verdict.kind, "red" if verdict.failed else "green"), f" ({run.report.outcome})")
        for f in run.report.findings:
            say(f"finding {f.kind}: {f.detail}")
        for line in run.report.notes:
            say(line)
        if graph is not None:
            say(f"wait-for graph written to {graph}")
    _judge_and_exit(run, verdict, json_, {"verdict": verdict.to_dict(), "unmet": [], "explanation": run.report.notes,
                                 "waitfor_dot": to_dot(verdict.waitfor, title)})
