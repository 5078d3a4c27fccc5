"""Commands on scenario files: `run` (simulate), `real` (real processes), `compare` (both,
diffed rank by rank) and `check` (the checker's verdict and wait-for graph). `run` and
`check` take several files, print a summary line and exit with the worst code; both judge
a file by `simdist.expect.judge`, so one verdict gives one exit code.

This module and `simdist/__init__` are where `simdist` reaches `real_backend` (its
`run_real`), and only when a command needs it, so `simdist run` never imports torch.
"""

from __future__ import annotations

import json
import sys
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer

from simdist.check.classify import Verdict, check_run
from simdist.check.explain import annotate_report
from simdist.chrome_trace import write_chrome_trace
from simdist.cli import script as script_cli
from simdist.cli.console import (
    ExitCode,
    bad_input,
    check_output_file,
    err,
    exit_on,
    exit_with,
    say,
    worst,
    write_output,
)
from simdist.cli.reports import print_report, say_judgement
from simdist.errors import InputError, SimdistError
from simdist.expect import Judgement, judge
from simdist.report import Report
from simdist.scenario import Scenario, Target, load_scenario

JsonOpt = Annotated[bool, typer.Option("--json", help="print the machine-readable report (docs/report.md)")]
TimeoutOpt = Annotated[float | None, typer.Option(
    help="watchdog seconds (default: the scenario's timeout_s; a script: 300 s without communication)")]


def _load(path: Path, target: Target = "sim") -> Scenario:
    """The scenario at `path`, valid for `target` (a bad one: one line, exit 2)."""
    with bad_input():
        return load_scenario(path, target)


@dataclass
class FileResult:
    """What one scenario file of a `run` or `check` came to."""

    path: Path
    code: int  # ExitCode of this file
    word: str  # "passed", "failed" or "bad input", for the summary line
    data: dict[str, Any] = field(default_factory=dict)  # what --json prints for this file


def _try_load(path: Path, target: Target = "sim") -> Scenario | str:
    """The scenario, or the one-line error that makes this file bad input."""
    try:
        return load_scenario(path, target)
    except SimdistError as e:
        return str(e)


def _bad_file(path: Path, message: str) -> FileResult:
    say(("error:", "red"), " ", message, console=err)
    return FileResult(path, int(ExitCode.BAD_INPUT), "bad input", {"file": str(path), "error": message})


def output_for(option: Path | None, scenario: Path, suffix: str, several: bool) -> Path | None:
    """Where one file's output goes: the option's path; with several scenarios, a folder
    (then `<folder>/<scenario stem><suffix>`) or a path with `{name}` in it."""
    if option is None:
        return None
    if "{name}" in str(option):
        return Path(str(option).replace("{name}", scenario.stem))
    if option.is_dir() and several:
        return option / f"{scenario.stem}{suffix}"
    return option


def check_outputs(option: Path | None, name: str, scenarios: list[Path], suffix: str) -> list[Path | None]:
    """Every file's output path, checked before anything runs (bad ones: exit 2)."""
    several = len(scenarios) > 1
    if option is not None and several and "{name}" not in str(option) and not option.is_dir():
        raise InputError(f"{name}: with several scenarios, give a folder or a path with {{name}} in it")
    paths = [output_for(option, p, suffix, several) for p in scenarios]
    for path in paths:
        check_output_file(path, name)
    return paths


def finish(results: list[FileResult], json_: bool, single_json: dict[str, Any] | None = None) -> NoReturn:
    """Exit with the worst code; with several files, a summary line (or JSON object) first."""
    code = worst([r.code for r in results])
    if len(results) == 1:
        if json_ and single_json is not None:
            sys.stdout.write(json.dumps(single_json, indent=2, default=str) + "\n")
        exit_with(ExitCode(code))
    if json_:
        sys.stdout.write(json.dumps({"exit_code": code, "files": [r.data for r in results]}, indent=2,
                                    default=str) + "\n")
    else:
        counts = {w: sum(r.word == w for r in results) for w in ("passed", "failed", "bad input")}
        say(("summary:", "bold"), f" {len(results)} files: " + ", ".join(f"{n} {w}" for w, n in counts.items())
            + f" (exit {code})")
    exit_with(ExitCode(code))


def _judged(report: Report, s: Scenario, verdict: Verdict, json_: bool) -> Judgement:
    """Judge the run; in text mode, say how it fared against [expect]."""
    j = judge(report, s.expect, verdict)
    if not json_:
        say_judgement(j, verdict)
    return j


def _code(j: Judgement, wrote: bool) -> int:
    if not wrote:
        return int(ExitCode.BAD_INPUT)
    return int(ExitCode.OK if j.passed else ExitCode.CHECK_FAILED)


def _word(code: int) -> str:
    return {0: "passed", 1: "failed"}.get(code, "bad input")


InputsArg = Annotated[list[str], typer.Argument(
    help="scenario TOML file(s), or one torch.distributed script (.py) followed by its own arguments (after --)",
    show_default=False)]
OneInputArg = Annotated[list[str], typer.Argument(
    help="a scenario TOML file, or a torch.distributed script (.py) followed by its own arguments (after --)",
    show_default=False)]


def _inputs(inputs: list[str], **script_options: Any) -> tuple[script_cli.ScriptInput | None, list[Path]]:
    """A script and its arguments, or scenario files (which take no script option). Call
    inside `bad_input()`."""
    if script_cli.is_script(inputs[0]):
        return script_cli.ScriptInput(Path(inputs[0]), tuple(inputs[1:]), **script_options), []
    script_cli.reject_for_scenario(**script_options)
    return None, [Path(p) for p in inputs]


def _one_scenario(paths: list[Path], command: str) -> Path:
    if len(paths) != 1:
        raise InputError(f"{command}: takes one scenario file (or one script and its arguments), got {len(paths)}")
    return paths[0]


def run(
    inputs: InputsArg,
    json_: JsonOpt = False,
    trace_out: Annotated[Path | None, typer.Option(
        "--trace-out", help="write a Chrome trace JSON (Perfetto); with several scenarios a folder or a "
                            "path with {name}")] = None,
    nproc_per_node: script_cli.NprocOpt = None,
    backend: script_cli.BackendOpt = None,
    timeout: script_cli.TimeoutOpt = None,
    batches: script_cli.BatchesOpt = None,
    zero_compute: script_cli.ZeroComputeOpt = False,
    topology: script_cli.TopologyOpt = None,
) -> None:
    """Simulate SCENARIO(S), or run SCRIPT.py on simulated ranks, and report what every rank did.

    Exit 0 when each passes (its [expect] holds; without [expect]: the checker finds nothing),
    1 when one fails, 2 for bad input; with several files, the worst.
    """
    from simdist.sim import simulate

    with bad_input():
        script, scenarios = _inputs(inputs, nproc_per_node=nproc_per_node, backend=backend, timeout=timeout,
                                    batches=batches, zero_compute=zero_compute, topology=topology)
        if script is not None:
            script_cli.run_command(script, json_, trace_out)
        traces = check_outputs(trace_out, "trace-out", scenarios, ".json")
    results: list[FileResult] = []
    single: dict[str, Any] | None = None
    for path, trace_path in zip(scenarios, traces, strict=True):
        s = _try_load(path)
        if isinstance(s, str):
            results.append(_bad_file(path, s))
            continue
        report = simulate(s)
        verdict = annotate_report(report, s)
        wrote = trace_path is None or write_output(lambda r=report, t=trace_path: write_chrome_trace(r, t),
                                                   trace_path, "trace-out")
        if not json_:
            if len(scenarios) > 1:
                say(("==", "bold"), f" {path}")
            print_report(report)
        j = _judged(report, s, verdict, json_)
        code = _code(j, wrote)
        single = report.to_dict()
        results.append(FileResult(path, code, _word(code), {"file": str(path), "exit_code": code, "report": single}))
    finish(results, json_, single)


def _run_real(s: Scenario, timeout: float | None, quiet: bool) -> Report:
    """The real run, with a machine that cannot host it (HostError) as bad input (exit 2)."""
    from real_backend.launch import run_real

    with bad_input():
        return run_real(s, timeout_s=timeout, progress=not quiet)


def real(
    inputs: OneInputArg,
    json_: JsonOpt = False,
    timeout: TimeoutOpt = None,
    nproc_per_node: script_cli.NprocOpt = None,
    batches: script_cli.BatchesOpt = None,
    backend: script_cli.RealBackendOpt = None,
) -> None:
    """Run SCENARIO (or SCRIPT.py) on real torch.distributed processes (Gloo on CPU; a
    scenario's NCCL on GPUs).

    Exit codes as for `simdist run`, judged on the real report.
    """
    with bad_input():
        script, paths = _inputs(inputs, nproc_per_node=nproc_per_node, batches=batches, backend=backend)
        if script is not None:
            script_cli.real_command(replace(script, timeout=timeout), json_)
        path = _one_scenario(paths, "real")
    s = _load(path, "real")
    report_and_exit(_run_real(s, timeout, json_), s, json_)


def report_and_exit(report: Report, s: Scenario, json_: bool) -> NoReturn:
    """Print a report (table or JSON) and exit 0/1 by `judge`, as `run` does for one file."""
    if json_:
        sys.stdout.write(report.to_json() + "\n")
    else:
        print_report(report)
    exit_on(_judged(report, s, check_run(report, s), json_).passed)


def compare(
    inputs: OneInputArg,
    json_: JsonOpt = False,
    timeout: TimeoutOpt = None,
    nproc_per_node: script_cli.NprocOpt = None,
    batches: script_cli.BatchesOpt = None,
    backend: script_cli.RealBackendOpt = None,
) -> None:
    """Run SCENARIO (or SCRIPT.py) in the simulator and on real processes, and diff them rank
    by rank: collectives, outcome, errors (and a script's printed lines). Exit 0: they agree.
    """
    from dataclasses import asdict

    from simdist.compare import compare_reports, format_comparison
    from simdist.sim import simulate

    with bad_input():
        script, paths = _inputs(inputs, nproc_per_node=nproc_per_node, batches=batches, backend=backend)
        if script is not None:
            script_cli.compare_command(replace(script, timeout=timeout), json_)
        path = _one_scenario(paths, "compare")
    s = _load(path, "real")
    sim_report = simulate(s)
    real_report = _run_real(s, timeout, json_)
    cmp = compare_reports(sim_report, real_report)
    if json_:
        sys.stdout.write(json.dumps({"agree": cmp.agree, "comparison": asdict(cmp),
                                     "sim": sim_report.to_dict(), "real": real_report.to_dict()}, default=str) + "\n")
    else:
        say(format_comparison(cmp))
    exit_on(cmp.agree)


def check(
    inputs: InputsArg,
    json_: Annotated[bool, typer.Option("--json", help="verdict, findings, explanation and wait-for graph as JSON")] = False,
    graph: Annotated[Path | None, typer.Option(
        "--graph", help="write the wait-for graph: .dot/.gv (DOT), .png/.svg/.pdf (picture); with several "
                        "scenarios a folder (DOT files) or a path with {name}")] = None,
    nproc_per_node: script_cli.NprocOpt = None,
    backend: script_cli.BackendOpt = None,
    timeout: script_cli.TimeoutOpt = None,
    batches: script_cli.BatchesOpt = None,
    zero_compute: script_cli.ZeroComputeOpt = False,
    topology: script_cli.TopologyOpt = None,
) -> None:
    """Simulate SCENARIO(S) and explain any hang, mismatch or broken invariant.

    Exit codes as for `simdist run` (the same rule, so one verdict gives one code): 0 passed
    (its [expect] holds, also when it expects a failure; without [expect]: nothing failed),
    1 failed, 2 bad input.
    """
    from simdist.check.drawing import check_graph_path, to_dot, write_graph
    from simdist.sim import simulate

    with bad_input():
        script, scenarios = _inputs(inputs, nproc_per_node=nproc_per_node, backend=backend, timeout=timeout,
                                    batches=batches, zero_compute=zero_compute, topology=topology)
        if script is not None:
            script_cli.check_command(script, json_, graph)
        graphs = check_outputs(graph, "graph", scenarios, ".dot")
        for g in graphs:
            if g is not None:
                check_graph_path(g)
    results: list[FileResult] = []
    single: dict[str, Any] | None = None
    for path, graph_path in zip(scenarios, graphs, strict=True):
        s = _try_load(path)
        if isinstance(s, str):
            results.append(_bad_file(path, s))
            continue
        report = simulate(s)
        verdict = annotate_report(report, s)
        wf = verdict.waitfor
        assert wf is not None  # check_run always builds it
        title = f"{s.name}: wait-for graph"
        wrote = graph_path is None or write_output(lambda g=graph_path, w=wf, t=title: write_graph(w, g, t),
                                                   graph_path, "graph")
        if not json_:
            if len(scenarios) > 1:
                say(("==", "bold"), f" {path}")
            say((verdict.kind, "red" if verdict.failed else "green"), f" ({report.outcome})")
            for f in report.findings:
                say(f"finding {f.kind}: {f.detail}")
            for line in report.notes:
                say(line)
            if graph_path is not None and wrote:
                say(f"wait-for graph written to {graph_path}")
        j = _judged(report, s, verdict, json_)
        code = _code(j, wrote)
        single = {"verdict": verdict.to_dict(), "passed": j.passed, "judged_by": j.by, "unmet": j.unmet,
                  "explanation": report.notes, "waitfor_dot": to_dot(wf, title), "report": report.to_dict()}
        results.append(FileResult(path, code, _word(code), {"file": str(path), "exit_code": code, **single}))
    finish(results, json_, single)


def register(app: typer.Typer) -> None:
    """Add run, real, compare and check as top-level commands of `app`."""
    for command in (run, real, compare, check):
        app.command()(command)
