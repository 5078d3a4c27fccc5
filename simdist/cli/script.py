"""`simdist run SCRIPT.py`: a user's torch.distributed script on simulated ranks.

One interface for both kinds of input: `run` takes a scenario (.toml) or a script (.py);
these options and the script's own arguments (after `--`) apply to scripts only.
"""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path
from typing import Annotated

import typer

from simdist.errors import ScriptError
from simdist.report import Report

NprocOpt = Annotated[int | None, typer.Option(
    "--nproc-per-node", help="script: start N ranks as torchrun would (default: the script starts its own)")]
BackendOpt = Annotated[str | None, typer.Option(
    "--backend", help="script: gloo or nccl semantics for ranks that exit (default: what the script asks for)")]
BatchesOpt = Annotated[str | None, typer.Option(
    "--batches", help="script: cap on the batches each rank's DataLoaders yield per epoch, one per rank (5,6) "
                      "or one for every rank (5)")]

DEFAULT_TIMEOUT_S = 300.0


def is_script(path: Path) -> bool:
    return path.suffix == ".py"


def reject_script_options(nproc_per_node: int | None, backend: str | None, timeout: float | None,
                          script_args: list[str] | None, batches: str | None = None) -> None:
    """A simulated scenario takes none of the script options: say so instead of ignoring them."""
    given = [name for name, v in (("--nproc-per-node", nproc_per_node), ("--backend", backend),
                                  ("--timeout", timeout), ("--batches", batches),
                                  ("script arguments", script_args)) if v]
    if given:
        raise ScriptError(f"{', '.join(given)}: only for a script (.py), not a scenario")


def run_command(path: Path, script_args: list[str] | None, nproc_per_node: int | None, backend: str | None,
                timeout: float | None, json_: bool, trace_out: Path | None,
                print_report: Callable[[Report], None], batches: str | None = None) -> None:
    """Run the script, print its report, exit 0 when every rank completed (1 otherwise)."""
    from simdist.chrome_trace import write_chrome_trace
    from simdist.script.api import run_script

    report = run_script(path, script_args or [], nproc_per_node=nproc_per_node, backend=backend,
                        timeout_s=timeout or DEFAULT_TIMEOUT_S, stdout=sys.stderr.fileno() if json_ else None,
                        batches=batches)
    if trace_out is not None:
        write_chrome_trace(report, trace_out)
    if json_:
        sys.stdout.write(report.to_json() + "\n")
    else:
        print_report(report)
    raise typer.Exit(0 if report.outcome == "completed" else 1)
