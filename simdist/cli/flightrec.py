"""Commands that speak the c10d Flight Recorder: `diagnose` (a job's dumps, judged by the
checker, optionally replayed as a scenario) and `export` (a simdist run as dumps that torch's
`torchfrtrace` reads). See docs/flight-recorder.md."""

from __future__ import annotations

import sys
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Literal

import typer

from simdist.cli.console import (
    ExitCode,
    bad_input,
    check_output_file,
    check_output_folder,
    exit_on,
    exit_with,
    say,
    show,
    table,
    write_output,
)

if TYPE_CHECKING:
    from simdist.flightrec.diagnose import Diagnosis

DumpsArg = Annotated[list[Path], typer.Argument(
    help="Flight Recorder dump files (<prefix><rank>, pickle or JSON) or folders of them; torchelastic "
         "error files (<rank>/error.json) alongside are read too")]


def diagnose(
    dumps: DumpsArg,
    json_: Annotated[bool, typer.Option("--json", help="verdict, progress, frames, explanation and report as JSON")] = False,
    replay: Annotated[Path | None, typer.Option(
        "--replay", help="write the scenario that replays each rank's operations (TOML), for simdist run / real")] = None,
    graph: Annotated[Path | None, typer.Option(
        "--graph", help="write the wait-for graph: .dot/.gv (DOT), .png/.svg/.pdf (picture)")] = None,
    frames: Annotated[int, typer.Option(help="Python frames shown per blocked call", min=0)] = 8,
) -> None:
    """Diagnose a job from its ranks' Flight Recorder dumps, with the checker `simdist check` uses.

    Exit 0 when nothing failed, 1 when the checker finds a failure (hang, mismatch, error), 2 for
    bad input (a file that is not a dump, a pickle that would run code, an unwritable output).
    """
    from simdist.check.drawing import check_graph_path, to_dot, write_graph
    from simdist.flightrec.diagnose import diagnose as run_diagnosis

    with bad_input():
        check_output_file(replay, "replay")
        if graph is not None:
            check_output_file(graph, "graph")
            check_graph_path(graph)
        d = run_diagnosis(dumps)
    wf = d.verdict.waitfor
    wrote = True
    if replay is not None:
        wrote = write_output(lambda: replay.write_text(replay_toml(d)), replay, "replay")
    if graph is not None and wf is not None:
        wrote = write_output(lambda: write_graph(wf, graph, "wait-for graph"), graph, "graph") and wrote
    if json_:
        import json

        doc = d.to_dict() | {"waitfor_dot": to_dot(wf, "wait-for graph") if wf is not None else None,
                             "replay": d.replay}
        sys.stdout.write(json.dumps(doc, indent=2, default=str) + "\n")
    else:
        _print(d, frames)
        if replay is not None and wrote:
            say(f"replay scenario written to {replay} (simdist run {replay}; simdist real {replay})")
        if graph is not None and wrote:
            say(f"wait-for graph written to {graph}")
    if not wrote:
        exit_with(ExitCode.BAD_INPUT)
    exit_on(not d.verdict.failed)


def replay_toml(d: Diagnosis) -> str:
    """The replay scenario as a commented TOML file."""
    from simdist.fuzz.counterexample import to_toml

    head = ["# simdist diagnose --replay: each rank's operations as its Flight Recorder dump records them",
            f"# dumps: {', '.join(str(d.dumps.dumps[r].path) for r in sorted(d.dumps.dumps))}",
            "# Replay: simdist run THIS_FILE (exit 0: the same outcome); simdist real THIS_FILE on Gloo.",
            *[f"# {' '.join(line.split())}" for line in d.explanation[:3]], ""]
    return "\n".join(head) + "\n" + to_toml(d.replay)


def _print(d: Diagnosis, n_frames: int) -> None:
    report = d.job.report
    errs = f"; error files for ranks {sorted(d.dumps.errors)}" if d.dumps.errors else ""
    say(f"Flight Recorder dumps of {d.dumps.world_size} ranks ({d.dumps.backend}, format {d.dumps.version}){errs}")
    say("groups: " + "; ".join(f"{g.name} = ranks {g.ranks}" for g in d.job.groups))
    t = table("rank", "status", "group", "last completed", "first never completed", "error / where", overflow="fold")
    for p in d.progress:
        for x in p.ranks:
            r = report.ranks[x.rank]
            last = x.last_completed.short() if x.last_completed else "-"
            pending = x.first_pending.short() if x.first_pending else "-"
            detail = f"{r.error.type}: {r.error.message.splitlines()[0] if r.error.message else ''}" if r.error else \
                (r.location.short() if r.location is not None else "")
            t.add_row(str(x.rank), r.status, p.group, last, pending, detail)
    show(t)
    say("progress, ranks grouped by how far they got (as NCCL's RAS groups a communicator's ranks):")
    for p in d.progress:
        say(f"  {p.group}: " + "; ".join(p.lines()))
    say((d.verdict.kind, "red" if d.verdict.failed else "green"), f" ({report.outcome})")
    for f in report.findings:
        say(("finding", "magenta"), f" {f.kind}: {f.detail}")
    for line in d.explanation:
        say(line)
    for r in sorted(d.job.frames):
        e = d.blocked_op(r)
        if e is None or n_frames == 0:
            continue
        lines = d.frame_lines(r, n_frames)
        if lines:
            say(f"frames of rank {r}'s {e.op} #{e.seq} on {e.group} (innermost first, > = your code):")
            for line in lines:
                say(f"    {line}")


def export(
    scenario: Annotated[Path, typer.Argument(help="scenario TOML file")],
    out: Annotated[Path, typer.Option("--out", "-o", help="folder for the per-rank dumps")],
    real: Annotated[bool, typer.Option("--real", help="run it on real torch.distributed processes, not simulated")] = False,
    form: Annotated[Literal["pickle", "json"], typer.Option("--format", help="pickle (what torchfrtrace reads) or json")] = "pickle",
    prefix: Annotated[str, typer.Option(help="file name prefix; the rank is appended, as torch does")] = "",
    timeout: Annotated[float | None, typer.Option(help="real: watchdog seconds (default: the scenario's)")] = None,
) -> None:
    """Run SCENARIO (simulated, or --real) and write each rank's Flight Recorder dump to OUT.

    torch's analyzer reads them: torchfrtrace OUT (python -m torch.distributed.flight_recorder.fr_trace OUT).
    Exit 0 when written, 2 for bad input.
    """
    from simdist.check.explain import annotate_report
    from simdist.cli.scenario import load_or_exit, run_real_or_exit
    from simdist.flightrec.export import export_dumps, write_dumps, write_error_files
    from simdist.flightrec.format import DEFAULT_DUMP_PREFIX
    from simdist.sim import simulate

    with bad_input():
        check_output_folder(out, "out")
        s = load_or_exit(scenario, "real" if real else "sim")
    report = run_real_or_exit(s, timeout, quiet=False) if real else simulate(s)
    verdict = annotate_report(report, s)
    paths: list[Path] = []
    errors: list[Path] = []

    def write() -> None:
        paths.extend(write_dumps(export_dumps(report, s), out, prefix or DEFAULT_DUMP_PREFIX, form))
        errors.extend(write_error_files(report, out))

    if not write_output(write, out, "out"):
        exit_with(ExitCode.BAD_INPUT)
    errs = f" and {len(errors)} torchelastic error files" if errors else ""
    say(f"{report.source} run of {s.name}: {report.outcome} ({verdict.kind}); wrote {len(paths)} dumps{errs} to {out}")
    say(f"read them with torch's analyzer: torchfrtrace {out}  (or: simdist diagnose {out})")
    exit_with(ExitCode.OK)


def register(app: typer.Typer) -> None:
    """Add diagnose and export as top-level commands of `app`."""
    for command in (diagnose, export):
        app.command()(command)
