"""`simdist fuzz`: draw schedules from templates, simulate and check each, shrink what fails.

Exit codes: 0 = every template's search ended as its `[fuzz].expect` says (no failure found,
or for ``expect = "failure"`` a failure found), 1 = one did not, 2 = bad input (one line
naming the field or option).
"""

from __future__ import annotations

import sys
from pathlib import Path
from typing import Annotated, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn
from rich.text import Text

from simdist.cli import fuzz_script
from simdist.cli import script as script_cli
from simdist.cli.console import ExitCode, bad_input, check_output_folder, err, exit_on, exit_with, say, show, table
from simdist.errors import InputError
from simdist.jsonout import dumps


def fuzz(
    templates: Annotated[list[Path], typer.Argument(
        help="template TOML file(s) (docs/fuzzing.md), or one script (.py) and its own arguments after --")],
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
    jobs: Annotated[int, typer.Option("--jobs", "-j", min=1,
                                      help="worker processes on this machine (the answer does not depend on it)")] = 1,
    cluster: Annotated[str | None, typer.Option("--cluster", metavar="ADDRESS",
                                                help="run the shards on a Dask cluster: a scheduler address "
                                                     "(tcp://HOST:8786), or 'local' for --jobs workers here; "
                                                     "needs pip install 'simdist[cluster]'")] = None,
    json_: Annotated[bool, typer.Option("--json", help="print a machine-readable summary")] = False,
    quiet: Annotated[bool, typer.Option("--quiet", "-q", help="no progress bar")] = False,
    nproc_per_node: script_cli.NprocOpt = None,
    nproc_range: fuzz_script.NprocRangeOpt = None,
    batches_range: fuzz_script.BatchesRangeOpt = fuzz_script.DEFAULT_BATCHES,
    backend: script_cli.BackendOpt = None,
    timeout: Annotated[float | None, typer.Option(help="script: watchdog seconds per schedule (default 60)")] = None,
) -> None:
    """Fuzz TEMPLATE(S): draw schedules (world size, uneven inputs, steps, join options), simulate and check each.

    A failure (hang, error, collective mismatch, broken invariant) is shrunk to a minimal scenario and written
    under --out as a plain scenario file that replays with `simdist run` / `simdist real` / `simdist compare`.

    A script (SCRIPT.py [-- ARGS]) is fuzzed over each rank's DataLoader cap and, torchrun-style
    (--nproc-per-node-range), its world size; its counterexamples are commands and a replay file.

    Exit 0 when each template's search ends as its [fuzz].expect says ("failure": a failure was found;
    "ok" or none: nothing was found), for a script when nothing was found; 1 otherwise, 2 for bad input.
    """
    if templates and script_cli.is_script(templates[0]):
        if jobs != 1 or cluster is not None:  # say so instead of ignoring them
            with bad_input():
                raise InputError("--jobs, --cluster: only for templates, not a script (.py)")
        fuzz_script.fuzz_script_command(templates, budget=budget, seed=seed, out_dir=out_dir, no_shrink=no_shrink,
                                        json_=json_, quiet=quiet, nproc=nproc_per_node, nproc_range=nproc_range,
                                        batches_range=batches_range, backend=backend, timeout=timeout)
    with bad_input():
        script_cli.reject_for_scenario(nproc_per_node=nproc_per_node, backend=backend, timeout=timeout)
        if nproc_range is not None or batches_range != fuzz_script.DEFAULT_BATCHES:
            raise InputError("--nproc-per-node-range, --batches-range: only for a script (.py), not a template")
    from simdist.fuzz.template import load_template

    with bad_input():
        check_output_folder(out_dir, "out")
        if not no_db:
            check_output_folder(db, "db")
        tpls = [load_template(p) for p in templates]
        executor = _executor(jobs, cluster)  # before any progress bar: local workers are forked
    try:
        results = _fuzz_all(tpls, executor, budget=budget, seed=seed, out_dir=out_dir, db=db,
                            no_db=no_db, no_shrink=no_shrink, no_compress=no_compress, jobs=jobs,
                            show=not (quiet or json_) and err.is_terminal, json_=json_)
    finally:
        if executor is not None:
            executor.close()
    failed = any(r.failed for r in results)
    as_expected = all(r.as_expected for r in results)
    if json_:
        sys.stdout.write(dumps({"failed": failed, "as_expected": as_expected, "seed": seed,
                                "results": [r.to_dict() for r in results]}) + "\n")
    else:
        _print_results(results, seed)
    exit_on(as_expected)


def _executor(jobs: int, cluster: str | None):
    """Where the shards run: None (this process, --jobs 1), local worker processes, or Dask."""
    if cluster is None:
        if jobs <= 1:
            return None
        from simdist.fuzz.campaign import LocalPool

        return LocalPool(jobs)
    try:
        from simdist.fuzz.cluster import DaskExecutor
    except ModuleNotFoundError as e:
        if (e.name or "").split(".")[0] not in ("distributed", "dask"):
            raise
        raise InputError("--cluster: needs Dask's distributed package: pip install 'simdist[cluster]'") from None
    return DaskExecutor(None if cluster == "local" else cluster, workers=jobs)


def _fuzz_all(tpls: list, executor, *, budget: int | None, seed: int, out_dir: Path, db: Path | None,
              no_db: bool, no_shrink: bool, no_compress: bool, jobs: int, show: bool, json_: bool = False) -> list:
    """Fuzz each template in turn, with a progress bar on a terminal."""
    from simdist.fuzz.runner import FuzzInterrupted, fuzz_template

    results = []
    for t in tpls:
        n = budget or t.budget
        progress = Progress(TextColumn("{task.fields[name]}", style="bold", markup=False),
                            TextColumn("{task.description}", markup=False), BarColumn(), MofNCompleteColumn(),
                            TextColumn("{task.fields[extra]}", markup=False), TimeElapsedColumn(),
                            console=err, disable=not show, transient=False)
        with progress:
            task = progress.add_task("generating", total=n, name=t.name, extra="")

            def on_example(count: int, phase: str, task=task, progress=progress, n=n) -> None:
                if phase == "generate":
                    progress.update(task, completed=min(count, n), description="generating")
                else:
                    progress.update(task, description=phase, extra=f"{count} runs")

            try:
                with bad_input():
                    r = fuzz_template(t, budget=n, seed=seed, out_dir=out_dir, db_dir=db, use_db=not no_db,
                                      shrink=not no_shrink, on_example=on_example, compress=not no_compress,
                                      jobs=jobs, executor=executor)
            except FuzzInterrupted as stop:
                progress.stop()
                _interrupted([*results, stop.result], json_)
            progress.update(task, completed=n)
        results.append(r)
    return results


def _interrupted(results: list, json_: bool) -> NoReturn:
    """Ctrl-C: say what was written and where (the fuzzer wrote it before stopping), exit 130."""
    if json_:
        sys.stdout.write(dumps({"interrupted": True, "failed": any(r.failed for r in results),
                                "results": [r.to_dict() for r in results]}) + "\n")
    paths = [c.path for r in results for c in r.counterexamples if c.path]
    if paths:
        for path in paths:
            say(f"interrupted: counterexample written: {path}  (replay: simdist run {path})", console=err)
    else:
        say("interrupted: no failure found so far, nothing written", console=err)
    exit_with(ExitCode.INTERRUPTED)


def _print_results(results: list, seed: int) -> None:
    t = table("template", "expect", "examples", "schedules", "sched/s", "distinct failures", "verdict",
              title=f"simdist fuzz (seed {seed}: --seed {seed} repeats this search)", overflow="fold")
    for r in results:
        verdict = "failure found" if r.failed else "no failure"
        style = "green" if r.as_expected else "red"
        t.add_row(r.template, r.expect or "ok", str(r.examples), str(r.schedules), f"{r.rate:.1f}",
                  str(len(r.failures)), Text(verdict + ("" if r.as_expected else " (unexpected)"), style=style))
    show(t)
    for r in results:
        for c in r.counterexamples:
            say((r.template, "red"), f": {c.key} -- {c.world_size} ranks, inputs {c.counts}, {c.steps} step(s); "
                f"first seen at schedule {c.found_at}")
            for line in c.explanation[:3]:
                say(f"    {line}")
            if c.path:
                say(f"    written: {c.path}  (replay: simdist run {c.path})")


def register(app: typer.Typer) -> None:
    """Add fuzz as a top-level command of `app`."""
    app.command(name="fuzz")(fuzz)
