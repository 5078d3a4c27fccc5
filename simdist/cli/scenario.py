"""Commands on one scenario file: `run` (simulate), `real` (real processes), `compare`
(both, diffed rank by rank) and `check` (the checker's verdict and wait-for graph).

This module and `simdist/__init__` are where `simdist` reaches `real_backend` (its
`run_real`), and only when a command needs it, so `simdist run` never imports torch.
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.table import Table

from simdist.cli.console import bad_input, exit_on, out, say
from simdist.jsonout import finite, write_json
from simdist.limits import check_timeout
from simdist.program.budget import check_ops
from simdist.report import Report
from simdist.scenario import Scenario, Target, load_scenario

ScenarioArg = Annotated[Path, typer.Argument(help="scenario TOML file")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the machine-readable report (docs/report.md)")]
TimeoutOpt = Annotated[float | None, typer.Option(help="watchdog seconds (default: the scenario's timeout_s)")]
_OUTCOME_STYLE = {"completed": "green", "hang": "yellow", "error": "red"}


def _load(path: Path, target: Target = "sim") -> Scenario:
    """The scenario at `path`, valid for `target` and within the resource limits (a bad one:
    one line naming the file, exit 2)."""
    with bad_input():
        s = load_scenario(path, target)
        check_ops(s, str(path))
        return s


def print_report(report: Report, title: str | None = None) -> None:
    """Per-rank table, outcome, findings and the explanation of any hang or error."""
    table = Table(title=title or f"{report.scenario} ({report.source})", show_lines=False)
    for col in ("rank", "status", "inputs", "collectives", "time (s)", "observed / error"):
        table.add_column(col, overflow="fold")
    for r in report.ranks:
        detail = ""
        if r.error:
            detail = f"{r.error.type}: {r.error.message}"
        elif r.blocked_in is not None:
            detail = f"blocked in {r.blocked_in.short()}"
            if r.waiting_in is not None and r.waiting_in is not r.blocked_in and r.waiting_in.seq != r.blocked_in.seq:
                detail += f"; waiting in {r.waiting_in.short()}"
        if r.observed:
            obs = ", ".join(f"{k}={_short(v)}" for k, v in r.observed.items())
            detail = f"{obs}; {detail}" if detail else obs
        table.add_row(str(r.rank), r.status, str(r.inputs_processed), str(len(r.trace)), f"{r.time:.6g}", detail)
    out.print(table)
    say("outcome: ", (report.outcome, _OUTCOME_STYLE[report.outcome]))
    for f in report.findings:
        say(("finding", "magenta"), f" {f.kind}: {f.detail}")
    for n in report.notes:
        say(n)


def _short(v: Any) -> str:
    if isinstance(v, list) and len(v) > 8:
        return f"[{', '.join(map(str, v[:3]))}, ... {len(v)} values, last {v[-1]}]"
    return str(v)


def report_and_exit(report: Report, s: Scenario, json_: bool) -> None:
    """Print the report (table or JSON) and exit 0/1 on the scenario's expectations or outcome."""
    from simdist.expect import check_expectations

    failures = check_expectations(report, s.expect)
    if json_:
        report.write_json(sys.stdout)
        sys.stdout.write("\n")
    else:
        print_report(report)
        for f in failures:
            say(("expectation not met", "red"), f" {f}")
        if s.expect is not None and not failures:
            say(("all expectations met", "green"))
    exit_on(not failures if s.expect is not None else report.outcome == "completed")


def run(
    scenario: ScenarioArg,
    json_: JsonOpt = False,
    trace_out: Annotated[Path | None, typer.Option("--trace-out", help="write a Chrome trace JSON (Perfetto)")] = None,
) -> None:
    """Simulate SCENARIO and report what every rank did."""
    from simdist.check.explain import annotate_report
    from simdist.chrome_trace import write_chrome_trace
    from simdist.sim import simulate

    s = _load(scenario)
    with bad_input(scenario):  # a limit met while running (e.g. a huge mismatched collective)
        report = simulate(s)
    annotate_report(report, s)
    if trace_out is not None:
        write_chrome_trace(report, trace_out)
    report_and_exit(report, s, json_)


def _run_real(s: Scenario, timeout: float | None, quiet: bool) -> Report:
    """The real run, with a machine that cannot host it (HostError) as bad input (exit 2)."""
    from real_backend.launch import run_real

    with bad_input():
        return run_real(s, timeout_s=timeout, progress=not quiet)


def _check_timeout(timeout: float | None) -> None:
    """--timeout, checked before anything runs (a bad one: one line, exit 2)."""
    if timeout is not None:
        with bad_input():
            check_timeout(timeout)


def real(scenario: ScenarioArg, json_: JsonOpt = False, timeout: TimeoutOpt = None) -> None:
    """Run SCENARIO on real torch.distributed processes (Gloo on CPU, NCCL on GPUs)."""
    _check_timeout(timeout)
    s = _load(scenario, "real")
    report_and_exit(_run_real(s, timeout, json_), s, json_)


def compare(scenario: ScenarioArg, json_: JsonOpt = False, timeout: TimeoutOpt = None) -> None:
    """Run SCENARIO in the simulator and for real, and diff them rank by rank."""
    from dataclasses import asdict

    from simdist.compare import compare_reports, format_comparison
    from simdist.sim import simulate

    _check_timeout(timeout)
    s = _load(scenario, "real")
    with bad_input(scenario):
        sim_report = simulate(s)
    real_report = _run_real(s, timeout, json_)
    cmp = compare_reports(sim_report, real_report)
    if json_:
        write_json({"agree": cmp.agree, "comparison": finite(asdict(cmp)), "sim": sim_report.to_jsonable(),
                    "real": real_report.to_jsonable()}, sys.stdout, indent=None, default=str)
        sys.stdout.write("\n")
    else:
        say(format_comparison(cmp))
    exit_on(cmp.agree)


def check(
    scenario: ScenarioArg,
    json_: Annotated[bool, typer.Option("--json", help="verdict, findings, explanation and wait-for graph as JSON")] = False,
    graph: Annotated[Path | None, typer.Option("--graph", help="write the wait-for graph as an image (.png/.svg/.pdf)")] = None,
) -> None:
    """Simulate SCENARIO and explain any hang, mismatch or broken invariant (exit 1 when something failed)."""
    from simdist.check.explain import annotate_report
    from simdist.check.waitfor import draw_waitfor
    from simdist.sim import simulate

    s = _load(scenario)
    with bad_input(scenario):
        report = simulate(s)
    verdict = annotate_report(report, s)
    if graph is not None and verdict.waitfor is not None:
        draw_waitfor(verdict.waitfor, graph, title=f"{s.name}: wait-for graph")
    if json_:
        write_json({"verdict": finite(verdict.to_dict()), "explanation": report.notes,
                    "report": report.to_jsonable()}, sys.stdout, default=str)
        sys.stdout.write("\n")
    else:
        say((verdict.kind, "red" if verdict.failed else "green"), f" ({report.outcome})")
        for f in report.findings:
            say(f"finding {f.kind}: {f.detail}")
        for line in report.notes:
            say(line)
        if graph is not None:
            say(f"wait-for graph written to {graph}")
    exit_on(not verdict.failed)


def register(app: typer.Typer) -> None:
    """Add run, real, compare and check as top-level commands of `app`."""
    for command in (run, real, compare, check):
        app.command()(command)
