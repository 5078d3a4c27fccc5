"""`simdist fuzz SCRIPT.py`: explore a script's per-rank batch caps and world size.

The options of `simdist fuzz` that only scripts take are declared here; `simdist.cli.fuzz`
hands a `.py` input over to `fuzz_script_command`. Exit codes as for templates: 0 nothing
found, 1 a failure was found (or the script fails without uneven inputs), 2 bad input,
130 interrupted (what was found is written first).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path
from typing import Annotated, Any, NoReturn

import typer
from rich.progress import BarColumn, MofNCompleteColumn, Progress, SpinnerColumn, TextColumn, TimeElapsedColumn

from simdist.cli.console import ExitCode, bad_input, check_output_folder, err, exit_on, exit_with, say
from simdist.errors import ScriptError

NprocRangeOpt = Annotated[str | None, typer.Option(
    "--nproc-per-node-range", help="script: world sizes to explore, LO:HI, torchrun-style (default: the script "
                                   "starts its own ranks)")]
BatchesRangeOpt = Annotated[str, typer.Option(
    "--batches-range", help="script: per-rank DataLoader caps to explore, LO:HI (HI comes down to an uncapped "
                            "epoch's length)")]
DEFAULT_BATCHES = "1:8"
DEFAULT_TIMEOUT_S = 60.0


def parse_range(text: str, field: str, low: int) -> tuple[int, int]:
    """'2:4' -> (2, 4); '3' -> (3, 3). Bad input raises ScriptError naming the field."""
    parts = text.split(":")
    if len(parts) not in (1, 2) or not all(p.strip().isdigit() for p in parts):
        raise ScriptError(f"{field}: expected LO:HI or N (whole numbers), got {text!r}")
    lo, hi = int(parts[0]), int(parts[-1])
    if lo < low or hi < lo:
        raise ScriptError(f"{field}: expected {low} <= LO <= HI, got {text!r}")
    return lo, hi


def fuzz_script_command(paths: list[Path], *, budget: int | None, seed: int, out_dir: Path, no_shrink: bool,
                        json_: bool, quiet: bool, nproc: int | None, nproc_range: str | None, batches_range: str,
                        backend: str | None, timeout: float | None) -> NoReturn:
    """Fuzz the script `paths[0]` (the rest: its own arguments, after --) and exit."""
    from simdist.fuzz.scripts import ScriptFuzzInterrupted, Tick, checked_space, fuzz_script
    from simdist.script.api import check_script

    script, args = paths[0], tuple(str(p) for p in paths[1:])
    with bad_input():
        check_script(script)
        check_output_folder(out_dir, "out")
        if nproc is not None and nproc_range is not None:
            raise ScriptError("--nproc-per-node, --nproc-per-node-range: give one or the other")
        worlds = (nproc, nproc) if nproc is not None else parse_range(nproc_range, "--nproc-per-node-range", 1) \
            if nproc_range is not None else None
        space = checked_space(script, args, worlds, parse_range(batches_range, "--batches-range", 0), backend,
                              timeout or DEFAULT_TIMEOUT_S,
                              ("--nproc-per-node-range" if nproc is None else "--nproc-per-node", "--batches-range",
                               "--backend"))
    n = budget or 200
    show = not (quiet or json_) and err.is_terminal
    # the bar: schedules checked of --budget (shrinking checks more, beyond the budget); the text:
    # the phase, distinct schedules run and failure classes found (`simdist.fuzz.scripts.Tick`)
    progress = Progress(SpinnerColumn(), TextColumn(script.name, style="bold", markup=False), BarColumn(bar_width=20),
                        MofNCompleteColumn(), TextColumn("{task.description}", markup=False), TimeElapsedColumn(),
                        console=err, disable=not show)
    with progress:
        task = progress.add_task("starting the fork server (imports torch once)", total=n)

        def on_example(tick: Tick) -> None:
            progress.update(task, completed=min(tick.examples, n), description=tick.describe())

        try:
            with bad_input():
                res = fuzz_script(space, budget=n, seed=seed, out_dir=out_dir, shrink=not no_shrink,
                                  on_example=on_example)
        except ScriptFuzzInterrupted as stop:
            progress.stop()
            _print(stop.result, json_, interrupted=True)
            exit_with(ExitCode.INTERRUPTED)
    _print(res, json_)
    exit_on(not res.failed)


def _print(res: Any, json_: bool, interrupted: bool = False) -> None:
    """The result (a `simdist.fuzz.scripts.ScriptFuzzResult`) as lines, or as JSON."""
    if json_:
        sys.stdout.write(json.dumps({"interrupted": interrupted, "failed": res.failed, "results": [res.to_dict()]},
                                    indent=2, default=str) + "\n")
        return
    head, *lines = res.lines(interrupted)
    verdict, rest = head.split(" ", 1)
    say((verdict, "yellow" if interrupted else "red" if res.failed else "green"), f" {rest}")
    for line in lines:
        say(line)
