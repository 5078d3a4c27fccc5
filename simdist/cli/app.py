"""The `simdist` command line.

Exit codes everywhere: 0 = success (the run completed, or met every expectation of its
`[expect]` block; compare: sim and real agree; fuzz: no failure found), 1 = the thing
checked did not hold, 2 = bad input (one line naming the field, never a traceback).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, Any

import typer
from rich.console import Console
from rich.table import Table

from simdist.check.explain import annotate_report
from simdist.cli import script as script_cli
from simdist.cli.fuzz import register as register_fuzz
from simdist.cli.timing import register as register_timing
from simdist.errors import SimdistError
from simdist.expect import check_expectations
from simdist.report import Report
from simdist.scenario import Scenario, load_scenario

app = typer.Typer(
    add_completion=False,
    no_args_is_help=True,
    help="Simulate, check and replay PyTorch distributed training loops (Join, DDP, ZeRO, uneven inputs).",
    pretty_exceptions_enable=False,
)
out = Console()
err = Console(stderr=True)

ScenarioArg = Annotated[Path, typer.Argument(help="scenario TOML file")]
ScenarioOrScriptArg = Annotated[Path, typer.Argument(help="scenario TOML file, or a torch.distributed script (.py)")]
JsonOpt = Annotated[bool, typer.Option("--json", help="print the machine-readable report (docs/report.md)")]


def _fail_input(message: str) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True)
    raise typer.Exit(2)


def _load(path: Path) -> Scenario:
    try:
        return load_scenario(path)
    except SimdistError as e:
        _fail_input(str(e))
        raise  # unreachable


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
    colour = {"completed": "green", "hang": "yellow", "error": "red"}[report.outcome]
    out.print(f"outcome: [{colour}]{report.outcome}[/{colour}]")
    for f in report.findings:
        out.print(f"[magenta]finding[/magenta] {f.kind}: {f.detail}", highlight=False, soft_wrap=True)
    for n in report.notes:
        out.print(n, highlight=False, soft_wrap=True)


def _short(v: Any) -> str:
    if isinstance(v, list) and len(v) > 8:
        return f"[{', '.join(map(str, v[:3]))}, ... {len(v)} values, last {v[-1]}]"
    return str(v)


def _report_and_exit(report: Report, s: Scenario, json_: bool) -> None:
    """Print the report (table or JSON) and exit 0/1 on the scenario's expectations or outcome."""
    failures = check_expectations(report, s.expect)
    if json_:
        sys.stdout.write(report.to_json() + "\n")
    else:
        print_report(report)
        for f in failures:
            out.print(f"[red]expectation not met[/red] {f}", highlight=False, soft_wrap=True)
        if s.expect is not None and not failures:
            out.print("[green]all expectations met[/green]")
    if s.expect is not None:
        raise typer.Exit(1 if failures else 0)
    raise typer.Exit(0 if report.outcome == "completed" else 1)


TimeoutOpt = Annotated[float | None, typer.Option(help="watchdog seconds (default: the scenario's timeout_s)")]


@app.command()
def run(
    scenario: ScenarioOrScriptArg,
    json_: JsonOpt = False,
    trace_out: Annotated[Path | None, typer.Option("--trace-out", help="write a Chrome trace JSON (Perfetto)")] = None,
    nproc_per_node: script_cli.NprocOpt = None,
    backend: script_cli.BackendOpt = None,
    timeout: TimeoutOpt = None,
    script_args: script_cli.ScriptArgs = None,
) -> None:
    """Simulate SCENARIO (or run SCRIPT.py on simulated ranks) and report what every rank did."""
    from simdist.chrome_trace import write_chrome_trace
    from simdist.sim import simulate

    if script_cli.is_script(scenario):
        script_cli.run_command(scenario, script_args, nproc_per_node, backend, timeout, json_, trace_out, print_report)
    script_cli.reject_script_options(nproc_per_node, backend, timeout, script_args)
    s = _load(scenario)
    report = simulate(s)
    annotate_report(report, s)
    if trace_out is not None:
        write_chrome_trace(report, trace_out)
    _report_and_exit(report, s, json_)


def _run_real(s: Scenario, timeout: float | None, quiet: bool) -> Report:
    """The real run, with a machine that cannot host it (HostError) as bad input (exit 2)."""
    from real_backend.launch import run_real

    try:
        return run_real(s, timeout_s=timeout, progress=not quiet)
    except SimdistError as e:
        _fail_input(str(e))
        raise


@app.command()
def real(scenario: ScenarioArg, json_: JsonOpt = False, timeout: TimeoutOpt = None) -> None:
    """Run SCENARIO on real torch.distributed processes (Gloo on CPU, NCCL on GPUs)."""
    s = _load(scenario)
    _report_and_exit(_run_real(s, timeout, json_), s, json_)


@app.command()
def compare(scenario: ScenarioArg, json_: JsonOpt = False, timeout: TimeoutOpt = None) -> None:
    """Run SCENARIO in the simulator and for real, and diff them rank by rank."""
    import json

    from simdist.compare import compare_reports, format_comparison
    from simdist.sim import simulate

    s = _load(scenario)
    sim_report = simulate(s)
    real_report = _run_real(s, timeout, json_)
    cmp = compare_reports(sim_report, real_report)
    if json_:
        from dataclasses import asdict

        sys.stdout.write(json.dumps({"agree": cmp.agree, "comparison": asdict(cmp),
                                     "sim": sim_report.to_dict(), "real": real_report.to_dict()}, default=str) + "\n")
    else:
        out.print(format_comparison(cmp), highlight=False, soft_wrap=True)
    raise typer.Exit(0 if cmp.agree else 1)


register_timing(app)  # bench, compare-timing, explain
register_fuzz(app)  # fuzz, check


def main() -> None:
    try:
        app()
    except SimdistError as e:
        err.print(f"[red]error:[/red] {e}", highlight=False, soft_wrap=True)
        sys.exit(2)
    except KeyboardInterrupt:
        err.print("interrupted")
        sys.exit(130)
    except Exception as e:  # a bug in simdist, not bad input: one line unless debugging
        import os

        if os.environ.get("SIMDIST_DEBUG"):
            raise
        err.print(f"[red]internal error:[/red] {type(e).__name__}: {e} (SIMDIST_DEBUG=1 shows the traceback)",
                  highlight=False, soft_wrap=True)
        sys.exit(3)


if __name__ == "__main__":
    main()
