"""`simdist fuzz` (and `simdist check`): registered on the main typer app by `register(app)`.

Exit codes: 0 = no failure found (check: the run is fine), 1 = a failure was found,
2 = bad input (one line naming the field).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.table import Table

from simdist.errors import SimdistError

out = Console()
err = Console(stderr=True)


def _fail_input(message: str) -> None:
    err.print(f"[red]error:[/red] {message}", highlight=False, soft_wrap=True, markup=True)
    raise typer.Exit(2)


def fuzz(
    templates: Annotated[list[Path], typer.Argument(help="template TOML file(s) (docs/fuzzing.md)")],
    budget: Annotated[int | None, typer.Option("--budget", "-n", min=1,
                                               help="examples to generate per template (default: the template's [fuzz].budget, else 200)")] = None,
    seed: Annotated[int, typer.Option("--seed", help="hypothesis seed; the same seed replays the same search")] = 0,
    out_dir: Annotated[Path, typer.Option("--out", help="folder for counterexample scenario files")] = Path("failures"),
    db: Annotated[Path | None, typer.Option("--db", help="example database folder (default: OUT/.examples)")] = None,
    no_db: Annotated[bool, typer.Option("--no-db", help="do not read or write the example database")] = False,
    no_shrink: Annotated[bool, typer.Option("--no-shrink", help="report the first failure found, unshrunk")] = False,
    no_compress: Annotated[bool, typer.Option("--no-compress",
                                              help="simulate every schedule in full (default: judge passes on the "
                                                   "schedule with the steady middle of each input gap removed)")] = False,
    json_: Annotated[bool, typer.Option("--json", help="print a machine-readable summary")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
) -> None:
    """Fuzz TEMPLATE(S): draw schedules (world size, uneven inputs, steps, join options), simulate and check each.

    A failure (hang, error, collective mismatch, broken invariant) is shrunk to a minimal scenario and written
    under --out as a plain scenario file that replays with `simdist run` / `simdist real` / `simdist compare`.
    """
    from simdist.fuzz.runner import fuzz_template
    from simdist.fuzz.template import load_template

    try:
        tpls = [load_template(p) for p in templates]
    except SimdistError as e:
        _fail_input(str(e))
        raise
    results = []
    for t in tpls:
        n = budget or t.budget
        show = not (quiet or json_) and err.is_terminal
        progress = Progress(TextColumn("[bold]{task.fields[name]}[/bold] {task.description}"), BarColumn(),
                            MofNCompleteColumn(), TextColumn("{task.fields[extra]}"), TimeElapsedColumn(),
                            console=err, disable=not show, transient=False)
        with progress:
            task = progress.add_task("generating", total=n, name=t.name, extra="")

            def on_example(count: int, phase: str, task=task, progress=progress, n=n) -> None:
                if phase == "generate":
                    progress.update(task, completed=min(count, n), description="generating")
                else:
                    progress.update(task, description=phase, extra=f"{count} runs")

            try:
                r = fuzz_template(t, budget=n, seed=seed, out_dir=out_dir, db_dir=db, use_db=not no_db,
                                  shrink=not no_shrink, on_example=on_example, compress=not no_compress)
            except SimdistError as e:
                _fail_input(str(e))
                raise
            progress.update(task, completed=n)
        results.append(r)
    failed = any(r.failed for r in results)
    if json_:
        sys.stdout.write(json.dumps({"failed": failed, "results": [r.to_dict() for r in results]}, indent=2) + "\n")
        raise typer.Exit(1 if failed else 0)
    table = Table(title="simdist fuzz")
    for col in ("template", "examples", "schedules", "sched/s", "distinct failures", "verdict"):
        table.add_column(col, overflow="fold")
    for r in results:
        verdict = "[red]FAIL[/red]" if r.failed else "[green]ok[/green]"
        table.add_row(r.template, str(r.examples), str(r.schedules), f"{r.rate:.1f}", str(len(r.failures)), verdict)
    out.print(table)
    for r in results:
        for c in r.counterexamples:
            out.print(f"[red]{r.template}[/red]: {c.key} -- {c.world_size} ranks, inputs {c.counts}, {c.steps} step(s); "
                      f"first seen at schedule {c.found_at}", highlight=False, soft_wrap=True)
            for line in c.explanation[:3]:
                out.print(f"    {line}", highlight=False, soft_wrap=True, markup=False)
            if c.path:
                out.print(f"    written: {c.path}  (replay: simdist run {c.path})", highlight=False, soft_wrap=True)
    raise typer.Exit(1 if failed else 0)


def check(
    scenario: Annotated[Path, typer.Argument(help="scenario TOML file")],
    json_: Annotated[bool, typer.Option("--json", help="verdict, findings, explanation and wait-for graph as JSON")] = False,
    graph: Annotated[Path | None, typer.Option("--graph", help="write the wait-for graph as an image (.png/.svg/.pdf)")] = None,
) -> None:
    """Simulate SCENARIO and explain any hang, mismatch or broken invariant (exit 1 when something failed)."""
    from simdist.check.explain import annotate_report
    from simdist.check.waitfor import draw_waitfor
    from simdist.scenario import load_scenario
    from simdist.sim import simulate

    try:
        s = load_scenario(scenario)
    except SimdistError as e:
        _fail_input(str(e))
        raise
    report = simulate(s)
    verdict = annotate_report(report, s)
    if graph is not None and verdict.waitfor is not None:
        draw_waitfor(verdict.waitfor, graph, title=f"{s.name}: wait-for graph")
    if json_:
        sys.stdout.write(json.dumps({"verdict": verdict.to_dict(), "explanation": report.notes,
                                     "report": report.to_dict()}, indent=2, default=str) + "\n")
    else:
        colour = "red" if verdict.failed else "green"
        out.print(f"[{colour}]{verdict.kind}[/{colour}] ({report.outcome})", highlight=False)
        for f in report.findings:
            out.print(f"finding {f.kind}: {f.detail}", highlight=False, soft_wrap=True, markup=False)
        for line in report.notes:
            out.print(line, highlight=False, soft_wrap=True, markup=False)
        if graph is not None:
            out.print(f"wait-for graph written to {graph}", highlight=False)
    raise typer.Exit(1 if verdict.failed else 0)


def register(app: typer.Typer) -> None:
    app.command(name="fuzz")(fuzz)
    app.command(name="check")(check)
