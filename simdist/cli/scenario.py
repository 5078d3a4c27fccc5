"""Commands on scenario files: `run` (simulate), `real` (real processes), `compare` (both,
diffed rank by rank), `check` (the checker's verdict and wait-for graph) and `schema` (the
files' JSON schema, for editors). Each of run, check, real
and compare also takes one torch.distributed script (.py) and its own arguments in place of
a scenario, handed to `simdist.cli.script`. `run` and `check` take several files, print a summary line and exit with the worst code; both judge
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
    check_output_folder,
    err,
    exit_on,
    exit_with,
    say,
    say_error,
    sourced,
    worst,
    write_output,
)
from simdist.cli.iteration_timing import compare_timing
from simdist.cli.reports import Compared, print_report, say_judgement
from simdist.errors import InputError, SimdistError
from simdist.expect import Judgement, judge
from simdist.jsonout import finite, write_json
from simdist.limits import check_timeout
from simdist.program.budget import check_ops
from simdist.report import Report
from simdist.scenario import Scenario, Target, load_scenario

JsonOpt = Annotated[bool, typer.Option("--json", help="print the machine-readable report (docs/report.md)")]
TimeoutOpt = Annotated[float | None, typer.Option(
    help="watchdog seconds (default: the scenario's timeout_s; a script: 300 s without communication)")]


def load_or_exit(path: Path, target: Target = "sim") -> Scenario:
    """The scenario at `path`, valid for `target` and within the resource limits (a bad one:
    one line naming the file, exit 2)."""
    with bad_input():
        s = load_scenario(path, target)
        check_ops(s, str(path))
        return s


@dataclass
class FileResult:
    """What one scenario file of a `run` or `check` came to."""

    path: Path
    code: int  # ExitCode of this file
    word: str  # "passed", "failed" or "bad input", for the summary line
    data: dict[str, Any] = field(default_factory=dict)  # what --json prints for this file


def _simulated(path: Path) -> tuple[Scenario, Report] | str:
    """The scenario at `path` and its simulated run, or the one-line error that makes this
    file bad input: invalid, over a resource limit, or meeting one while it runs (a huge
    mismatched collective)."""
    from simdist.sim import simulate

    try:
        s = load_scenario(path)
        check_ops(s, str(path))
        return s, simulate(s)
    except SimdistError as e:
        return sourced(str(e), path)


def _bad_file(path: Path, message: str) -> FileResult:
    say_error(message)
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
            write_json(single_json, sys.stdout, default=str)
            sys.stdout.write("\n")
        exit_with(ExitCode(code))
    if json_:
        write_json({"exit_code": code, "files": [r.data for r in results]}, sys.stdout, default=str)
        sys.stdout.write("\n")
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
    gpus_per_node: script_cli.GpusOpt = None,
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
    _check_timeout(timeout)  # a script's watchdog; a scenario refuses the option below
    with bad_input():
        script, scenarios = _inputs(inputs, gpus_per_node=gpus_per_node,
                                    nproc_per_node=nproc_per_node, backend=backend, timeout=timeout,
                                    batches=batches, zero_compute=zero_compute, topology=topology)
        if script is not None:
            script_cli.run_command(script, json_, trace_out)
        traces = check_outputs(trace_out, "trace-out", scenarios, ".json")
    results: list[FileResult] = []
    single: dict[str, Any] | None = None
    for path, trace_path in zip(scenarios, traces, strict=True):
        run_ = _simulated(path)
        if isinstance(run_, str):
            results.append(_bad_file(path, run_))
            continue
        s, report = run_
        verdict = annotate_report(report, s)
        wrote = trace_path is None or write_output(lambda r=report, t=trace_path: write_chrome_trace(r, t),
                                                   trace_path, "trace-out")
        if not json_:
            if len(scenarios) > 1:
                say(("==", "bold"), f" {path}")
            print_report(report)
        j = _judged(report, s, verdict, json_)
        code = _code(j, wrote)
        single = report.to_jsonable()  # written as it streams out (simdist.jsonout)
        results.append(FileResult(path, code, _word(code), {"file": str(path), "exit_code": code, "report": single}))
    finish(results, json_, single)


def run_real_or_exit(s: Scenario, timeout: float | None, quiet: bool, fr_dumps: Path | None = None) -> Report:
    """The real run, with a machine that cannot host it (HostError) as bad input (exit 2)."""
    from real_backend.launch import run_real

    with bad_input():
        return run_real(s, timeout_s=timeout, progress=not quiet, fr_dumps=fr_dumps)


def _check_timeout(timeout: float | None) -> None:
    """--timeout, checked before anything runs (a bad one: one line, exit 2)."""
    if timeout is not None:
        with bad_input():
            check_timeout(timeout)


def real(
    inputs: OneInputArg,
    json_: JsonOpt = False,
    timeout: TimeoutOpt = None,
    fr_dumps: Annotated[Path | None, typer.Option(
        "--fr-dumps", help="leave each rank's Flight Recorder dump and torchelastic error file in this folder, "
                           "as torch does (TORCH_FR_DUMP_TEMP_FILE, TORCHELASTIC_ERROR_FILE): simdist diagnose "
                           "reads them")] = None,
    nproc_per_node: script_cli.NprocOpt = None,
    gpus_per_node: script_cli.GpusOpt = None,
    batches: script_cli.BatchesOpt = None,
    backend: script_cli.RealBackendOpt = None,
    hang_after: script_cli.HangAfterOpt = None,
) -> None:
    """Run SCENARIO (or SCRIPT.py) on real torch.distributed processes (Gloo on CPU; a
    scenario's NCCL on GPUs).

    Exit codes as for `simdist run`, judged on the real report.
    """
    _check_timeout(timeout)
    with bad_input():
        script, paths = _inputs(inputs, gpus_per_node=gpus_per_node,
                                nproc_per_node=nproc_per_node, batches=batches, backend=backend,
                                hang_after=hang_after)
        if script is not None:
            if fr_dumps is not None:
                raise InputError("--fr-dumps: only for a scenario (a script's Flight Recorder is in its report)")
            script_cli.real_command(replace(script, timeout=timeout), json_)
        scenario = _one_scenario(paths, "real")
        check_output_folder(fr_dumps, "fr-dumps")
    s = load_or_exit(scenario, "real")
    report_and_exit(run_real_or_exit(s, timeout, json_, fr_dumps), s, json_)


def report_and_exit(report: Report, s: Scenario, json_: bool) -> NoReturn:
    """Print a report (table or JSON) and exit 0/1 by `judge`, as `run` does for one file."""
    if json_:
        report.write_json(sys.stdout)
        sys.stdout.write("\n")
    else:
        print_report(report)
    exit_on(_judged(report, s, check_run(report, s), json_).passed)


def compare(
    ctx: typer.Context,
    inputs: OneInputArg,
    json_: JsonOpt = False,
    timeout: TimeoutOpt = None,
    nproc_per_node: script_cli.NprocOpt = None,
    gpus_per_node: script_cli.GpusOpt = None,
    batches: script_cli.BatchesOpt = None,
    backend: script_cli.RealBackendOpt = None,
    hang_after: script_cli.HangAfterOpt = None,
    timing: Annotated[bool, typer.Option(
        "--timing", help="compare time instead: per iteration and rank, measured wall clock against the "
                         "iteration simulated with a calibrated Gloo profile (exit 0: median |error| <= "
                         "--max-error)")] = False,
    profile: Annotated[Path | None, typer.Option(
        help="with --timing: the profile `simdist calibrate` wrote (default: the scenario's topology.profile)")] = None,
    runs: Annotated[int, typer.Option(help="with --timing: real runs; each (iteration, rank) is measured as the "
                                           "25th percentile over them")] = 3,
    max_error: Annotated[float, typer.Option("--max-error", help="with --timing: the median |error| allowed")] = 0.15,
) -> None:
    """Run SCENARIO (or SCRIPT.py) in the simulator and on real processes, and diff them rank
    by rank: collectives, outcome, errors (and a script's printed lines). Exit 0: they agree;
    4: they differ only by a race of the real run (each race said: not a model difference, and
    not agreement: rerun to see the real side take the simulator's outcome); 1: they differ.
    With --timing, compare each iteration's time instead (docs/timing.md).
    """
    from simdist.sim import simulate

    _check_timeout(timeout)
    with bad_input():
        if not timing:  # options of --timing alone would otherwise be silently ignored
            for name, flag in (("profile", "--profile"), ("runs", "--runs"), ("max_error", "--max-error")):
                # (typer's own click: its ParameterSource is not click's, so by name)
                if getattr(ctx.get_parameter_source(name), "name", "DEFAULT") != "DEFAULT":
                    raise InputError(f"{flag}: only with --timing")
        script, paths = _inputs(inputs, gpus_per_node=gpus_per_node,
                                nproc_per_node=nproc_per_node, batches=batches, backend=backend,
                                hang_after=hang_after)
        if script is not None and timing:
            raise InputError("--timing: times a scenario file's iterations, not a script")
        if script is not None:
            script_cli.compare_command(replace(script, timeout=timeout), json_)
        scenario = _one_scenario(paths, "compare")
    s = load_or_exit(scenario, "real")
    if timing:
        compare_timing(s, profile, runs, lambda: run_real_or_exit(s, timeout, True), json_, max_error)
    with bad_input(scenario):
        sim_report = simulate(s)
    real_report = run_real_or_exit(s, timeout, json_)
    compared = Compared.of(sim_report, real_report)
    if json_:
        write_json({**compared.jsonable(), "sim": sim_report.to_jsonable(), "real": real_report.to_jsonable()},
                   sys.stdout, indent=None, default=str)
        sys.stdout.write("\n")
    else:
        compared.say()
    exit_with(compared.code)


def check(
    inputs: InputsArg,
    json_: Annotated[bool, typer.Option("--json", help="verdict, findings, explanation and wait-for graph as JSON")] = False,
    graph: Annotated[Path | None, typer.Option(
        "--graph", help="write the wait-for graph: .dot/.gv (DOT), .png/.svg/.pdf (picture); with several "
                        "scenarios a folder (DOT files) or a path with {name}")] = None,
    nproc_per_node: script_cli.NprocOpt = None,
    gpus_per_node: script_cli.GpusOpt = None,
    backend: script_cli.BackendOpt = None,
    timeout: script_cli.TimeoutOpt = None,
    batches: script_cli.BatchesOpt = None,
    zero_compute: script_cli.ZeroComputeOpt = False,
    topology: script_cli.TopologyOpt = None,
) -> None:
    """Simulate SCENARIO(S) (or run SCRIPT.py on simulated ranks) and explain any hang, mismatch or broken invariant.

    Exit codes as for `simdist run` (the same rule, so one verdict gives one code): 0 passed
    (its [expect] holds, also when it expects a failure; without [expect]: nothing failed),
    1 failed, 2 bad input.
    """
    from simdist.check.drawing import check_graph_path, to_dot, write_graph

    _check_timeout(timeout)
    with bad_input():
        script, scenarios = _inputs(inputs, gpus_per_node=gpus_per_node,
                                    nproc_per_node=nproc_per_node, backend=backend, timeout=timeout,
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
        run_ = _simulated(path)
        if isinstance(run_, str):
            results.append(_bad_file(path, run_))
            continue
        s, report = run_
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
        single = {"verdict": finite(verdict.to_dict()), "passed": j.passed, "judged_by": j.by, "unmet": j.unmet,
                  "explanation": report.notes, "waitfor_dot": to_dot(wf, title), "report": report.to_jsonable()}
        results.append(FileResult(path, code, _word(code), {"file": str(path), "exit_code": code, **single}))
    finish(results, json_, single)


def schema(
    out: Annotated[Path | None, typer.Option("--out", "-o", help="write it to this file instead of stdout")] = None,
) -> None:
    """Print the scenario files' JSON schema, generated from the model, for TOML editors.

    Save it next to your scenarios and put `#:schema ./scenario.schema.json` on the first
    line of a scenario file: taplo and Even Better TOML then complete keys, show each key's
    meaning and flag mistakes as you type (docs/scenarios.md, Editor support).
    """
    from simdist.scenario import json_schema

    with bad_input():
        check_output_file(out, "out")
    text = json.dumps(json_schema(), indent=2) + "\n"
    if out is None:
        sys.stdout.write(text)
        return
    if not write_output(lambda: out.write_text(text), out, "out"):
        exit_with(ExitCode.BAD_INPUT)
    say(f"scenario schema written to {out}", console=err)


def register(app: typer.Typer) -> None:
    """Add run, real, compare, check and schema as top-level commands of `app`."""
    for command in (run, real, compare, check, schema):
        app.command()(command)
