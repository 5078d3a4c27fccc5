"""`simdist bench`, `simdist compare-timing`, `simdist explain`, `simdist calibrate`.

Mount into the main CLI with ``register(app)`` (commands at top level) or
``app.add_typer(timing.app)``. Exit codes: 0 ok, 1 target missed (compare-timing),
2 bad input (one line naming the field, no traceback). The commands check their
options, call the real backend (`real_backend.bench`) or the timing model
(`simdist.timing`), and print with `simdist.cli.timing_view`.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated

import typer
from pydantic import TypeAdapter, ValidationError
from rich.progress import Progress

import simdist.cli.timing_view as view
from real_backend import bench
from simdist.chrome_trace import write_chrome_trace
from simdist.cli.console import ExitCode, check_output_file, err, fail, parse_size, say, write_output
from simdist.errors import InputError, SimdistError
from simdist.jsonout import dumps
from simdist.network.profile import OpProfile, Profile
from simdist.network.simulate import timeline_report
from simdist.timing import experiments, plots
from simdist.timing.explain import explain
from simdist.timing.explain import sweep as explain_sweep
from simdist.timing.sweeps import geometric_sizes
from simdist.userfiles import read_json

app = typer.Typer(help="Communication cost model: benchmarks, calibration, explanations.", no_args_is_help=True,
                  rich_markup_mode=None)
CALIBRATABLE = tuple(o for o in bench.BENCH_OPS if o != "barrier")  # a barrier moves no bytes to fit

_fail = fail  # shared: one line "error: ...", then the exit code (2 unless said)


def _first_line(e: Exception) -> str:
    return str(e).splitlines()[0] if str(e) else type(e).__name__


def _progress() -> Progress:
    return Progress(console=err, transient=True)


def _check_backend(backend: str) -> None:
    if backend not in ("gloo", "nccl"):
        raise InputError(f"backend: unknown backend '{backend}' (choose from gloo, nccl)")


def _check_gpus(backend: str, ranks: int) -> None:
    """For nccl: this machine has one GPU per rank."""
    if backend == "nccl":
        import torch  # only here: importing torch costs seconds

        if not torch.cuda.is_available():
            raise InputError("backend: nccl needs CUDA, and torch.cuda.is_available() is False here")
        if torch.cuda.device_count() < ranks:
            raise InputError(f"ranks: nccl needs one GPU per rank, found {torch.cuda.device_count()}")


# =========================================================================== bench
def bench_cmd(
    backend: Annotated[str, typer.Option(help="gloo (CPU) or nccl (GPU)")] = "gloo",
    ranks: Annotated[int, typer.Option(help="world size (processes on 127.0.0.1)")] = 2,
    op: Annotated[str, typer.Option(help="collective(s), comma separated: all_reduce,all_gather,...")] = "all_reduce",
    min_bytes: Annotated[str, typer.Option("--min-bytes", "-b", help="smallest size per rank")] = "1K",
    max_bytes: Annotated[str, typer.Option("--max-bytes", "-e", help="largest size per rank")] = "64M",
    factor: Annotated[int, typer.Option("--factor", "-f", help="size multiplication factor")] = 2,
    warmup: Annotated[int, typer.Option(help="untimed operations per size")] = 5,
    repeats: Annotated[int, typer.Option(help="timed batches per size (median reported)")] = 11,
    batch_ms: Annotated[float, typer.Option(help="target duration of one timed batch (ms)")] = 30.0,
    out: Annotated[Path | None, typer.Option(help="write results to this .csv or .json")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print JSON rows on stdout")] = False,
    seed: Annotated[int | None, typer.Option(help="shuffle the order sizes are measured in")] = None,
    pin: Annotated[bool, typer.Option(help="pin rank i to CPU i mod ncpu")] = False,
) -> None:
    """nccl-tests-style sweep on the real backend: time, algbw, busbw per size and op."""
    try:
        ops = [o.strip() for o in op.split(",") if o.strip()]
        for o in ops:
            if o not in bench.BENCH_OPS:
                raise InputError(f"op: unknown op '{o}' (choose from {', '.join(bench.BENCH_OPS)})")
        _check_backend(backend)
        if ranks < 1:
            raise InputError("ranks: must be >= 1")
        lo, hi = parse_size(min_bytes, "min-bytes"), parse_size(max_bytes, "max-bytes")
        if lo < 1 or hi < lo:
            raise InputError("max-bytes: must be >= min-bytes >= 1")
        if factor < 2:
            raise InputError("factor: must be >= 2")
        if repeats < 1 or warmup < 0:
            raise InputError("repeats: must be >= 1 (and warmup >= 0)")
        check_output_file(out, "out")
        _check_gpus(backend, ranks)
    except InputError as e:
        _fail(str(e))
        return
    sizes = geometric_sizes(lo, hi, factor)
    rows = []
    try:
        with _progress() as prog:
            for o in ops:
                task = prog.add_task(f"{backend} {o} x{ranks}", total=len(sizes) if o != "barrier" else 1)
                rows += bench.run_sweep(
                    o,
                    ranks,
                    sizes,
                    backend,
                    warmup=warmup,
                    repeats=repeats,
                    target_batch_s=batch_ms / 1e3,
                    seed=seed,
                    pin=pin,
                    progress=lambda i, n, row, task=task: prog.update(task, completed=i),
                )
    except (RuntimeError, TimeoutError, ValueError) as e:
        _fail(_first_line(e), 1)
        return
    wrote = out is None or write_output(lambda: bench.save_rows(rows, out), out, "out")
    if json_out:
        typer.echo(dumps([r.to_dict() for r in rows], indent=1))
    else:
        view.print_bench(rows, backend, ranks, repeats)
        if out is not None and wrote:
            typer.echo(f"wrote {out}")
    if not wrote:
        raise typer.Exit(int(ExitCode.BAD_INPUT))


# =========================================================================== compare-timing
def compare_timing_cmd(
    backend: Annotated[str, typer.Option(help="gloo (CPU) or nccl (GPU)")] = "gloo",
    ranks: Annotated[int, typer.Option(help="world size")] = 2,
    op: Annotated[str, typer.Option(help="collective to calibrate")] = "all_reduce",
    min_bytes: Annotated[str, typer.Option("--min-bytes", help="smallest size")] = "1K",
    max_bytes: Annotated[str, typer.Option("--max-bytes", help="largest size")] = "64M",
    sweeps: Annotated[int, typer.Option(help="sweeps of each kind (calibration, held-out), alternating")] = 3,
    repeats: Annotated[int, typer.Option(help="timed batches per size and sweep")] = 11,
    stat: Annotated[
        str,
        typer.Option(
            help="per-size statistic: auto (the one that repeats best between calibration sweeps), op_p10, op_p25, op_median, min, median"
        ),
    ] = "auto",
    max_error: Annotated[
        float | None,
        typer.Option(help="target for the held-out median |error| (fraction); default 0.10 at 2 ranks, 0.20 above"),
    ] = None,
    plot: Annotated[
        Path | None, typer.Option(help="plot path (default out/compare-timing-<backend>-p<ranks>.png)")
    ] = None,
    save_profile: Annotated[Path | None, typer.Option(help="write the calibrated profile JSON here")] = None,
    save_raw: Annotated[Path | None, typer.Option(help="write the full result with raw samples here")] = None,
    load: Annotated[
        Path | None, typer.Option(help="reuse measurements from a --save-raw file instead of measuring")
    ] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the result as JSON")] = False,
    seed: Annotated[int, typer.Option(help="seed for the order sizes are measured in")] = 0,
) -> None:
    """Measure, calibrate on one sweep, predict held-out sizes from another; report errors."""
    try:
        lo, hi = _check_compare(backend, ranks, op, stat, min_bytes, max_bytes, sweeps, repeats, max_error)
        for path, name in ((plot, "plot"), (save_profile, "save-profile"), (save_raw, "save-raw")):
            check_output_file(path, name)
        loaded = _load_raw(load) if load is not None else None
        if loaded is None:
            _check_gpus(backend, ranks)
    except InputError as e:
        _fail(str(e))
        return
    if loaded is not None:
        train_rows, test_rows, gamma = loaded
        ranks, op, backend = train_rows[0][0].world_size, train_rows[0][0].op, train_rows[0][0].backend
    try:
        if loaded is None:
            res = _measure_and_compare(backend, ranks, op, lo, hi, sweeps, repeats, stat, seed)
        else:
            res = experiments.run_compare(
                backend, ranks, op, stat=stat, train_rows=train_rows, test_rows=test_rows, gamma=gamma
            )
    except (RuntimeError, TimeoutError) as e:
        _fail(_first_line(e), 1)
        return
    target = max_error if max_error is not None else (0.10 if ranks <= 2 else 0.20)
    res["max_error"] = target
    res["ok"] = bool(res["median_abs_error"] <= target)
    plot_path = plot if plot is not None else Path("out") / f"compare-timing-{backend}-p{ranks}.png"
    if plot is None:
        plot_path.parent.mkdir(parents=True, exist_ok=True)  # the default folder; a given one must exist
    wrote = write_output(lambda: plots.plot_compare(res, plot_path), plot_path, "plot")
    res["plot"] = str(plot_path) if wrote else None
    wrote &= _save_compare(res, save_profile, save_raw)
    if json_out:
        typer.echo(dumps({k: v for k, v in res.items() if k != "raw"}, indent=1))
    else:
        view.print_compare(res)
    if not wrote:
        raise typer.Exit(int(ExitCode.BAD_INPUT))
    if not res["ok"]:
        raise typer.Exit(int(ExitCode.CHECK_FAILED))


def _check_compare(
    backend: str,
    ranks: int,
    op: str,
    stat: str,
    min_bytes: str,
    max_bytes: str,
    sweeps: int,
    repeats: int,
    max_error: float | None,
) -> tuple[int, int]:
    """The options' own checks (the backend's machine is checked only when measuring)."""
    _check_backend(backend)
    if ranks < 2:
        raise InputError("ranks: compare-timing needs at least 2 ranks")
    if op not in CALIBRATABLE:
        raise InputError(f"op: cannot calibrate '{op}' (choose from {', '.join(CALIBRATABLE)})")
    if stat not in experiments.STAT_CHOICES:
        raise InputError(f"stat: unknown statistic '{stat}' (choose from {', '.join(experiments.STAT_CHOICES)})")
    lo, hi = parse_size(min_bytes, "min-bytes"), parse_size(max_bytes, "max-bytes")
    if lo < 4 or hi < 4 * lo:
        raise InputError("max-bytes: need min-bytes >= 4 and max-bytes >= 4 * min-bytes")
    if sweeps < 1 or repeats < 1:
        raise InputError("sweeps: sweeps and repeats must be >= 1")
    if max_error is not None and max_error <= 0:
        raise InputError("max-error: must be > 0")
    return lo, hi


_SWEEPS = TypeAdapter(list[list[bench.BenchRow]])


def _load_raw(path: Path) -> tuple[list[list], list[list], float | None]:
    """(calibration sweeps, held-out sweeps, gamma) from a --save-raw file, read as any user
    file is (`simdist.userfiles`) and checked in shape, so a wrong file is one line, exit 2."""
    try:
        saved = read_json(path, "measurements")
        raw = saved["raw"]
        train_rows, test_rows = (_SWEEPS.validate_python(raw[k]) for k in ("train", "test"))
        gamma = TypeAdapter(float | None).validate_python(saved.get("gamma"))
    except SimdistError as e:
        raise InputError(f"load: {e}") from None
    except (KeyError, TypeError):
        raise InputError(f"load: {path} is not a --save-raw file (it needs raw.train and raw.test)") from None
    except ValidationError as e:
        first = e.errors()[0]
        where = ".".join(str(x) for x in first["loc"])
        raise InputError(f"load: {path} is not a --save-raw file ({where}: {first['msg']})") from None
    if not train_rows or not train_rows[0] or not test_rows:
        raise InputError(f"load: {path} holds no measurements")
    return train_rows, test_rows, gamma


def _measure_and_compare(
    backend: str, ranks: int, op: str, lo: int, hi: int, sweeps: int, repeats: int, stat: str, seed: int
) -> dict:
    with _progress() as prog:
        task = prog.add_task(f"{backend} {op} x{ranks}: {sweeps} calibration + {sweeps} held-out sweeps", total=None)
        return experiments.run_compare(
            backend,
            ranks,
            op,
            lo,
            hi,
            sweeps=sweeps,
            repeats=repeats,
            stat=stat,
            seed=seed,
            run_sweep=bench.run_sweep,
            progress=lambda i, n, row: prog.update(task, completed=i, total=n),
        )


def _save_compare(res: dict, save_profile: Path | None, save_raw: Path | None) -> bool:
    """Write the profile and the raw result where asked; False when a write failed (said on stderr)."""
    ok = True
    if save_profile is not None:
        prof = Profile()
        prof.add(OpProfile.from_dict(res["profile"]))
        ok &= write_output(lambda: prof.save(save_profile), save_profile, "save-profile")
    if save_raw is not None:
        ok &= write_output(lambda: save_raw.write_text(dumps(res, indent=1)), save_raw, "save-raw")
    return ok


# =========================================================================== explain
def explain_cmd(
    op: Annotated[
        str,
        typer.Argument(
            help="collective: all_reduce, broadcast, reduce, all_gather, reduce_scatter, all_to_all, gather, scatter, barrier"
        ),
    ],
    algo: Annotated[str, typer.Option(help="algorithm, or auto")] = "auto",
    ranks: Annotated[int, typer.Option(help="number of ranks p")] = 4,
    nbytes: Annotated[str, typer.Option("--bytes", help="bytes per rank (all_gather: per-rank contribution)")] = "1M",
    preset: Annotated[str, typer.Option(help="topology preset for alpha/beta/gamma")] = "loopback",
    alpha_us: Annotated[float | None, typer.Option(help="override alpha (microseconds)")] = None,
    bandwidth_gbps: Annotated[float | None, typer.Option(help="override 1/beta (GB/s)")] = None,
    gamma_gbps: Annotated[float | None, typer.Option(help="override 1/gamma (reduction GB/s)")] = None,
    trace: Annotated[Path | None, typer.Option(help="write the timeline as a Chrome trace JSON")] = None,
    json_out: Annotated[bool, typer.Option("--json", help="print the explanation as JSON")] = False,
    sweep: Annotated[bool, typer.Option("--sweep", help="a size table in nccl-tests' columns (sizes -b .. -e)")] = False,
    min_bytes: Annotated[str, typer.Option("--min-bytes", "-b", help="--sweep: smallest size per rank")] = "8",
    max_bytes: Annotated[str, typer.Option("--max-bytes", "-e", help="--sweep: largest size per rank")] = "128M",
    factor: Annotated[int, typer.Option("--factor", "-f", help="--sweep: size multiplication factor")] = 2,
) -> None:
    """Formula with numbers, algbw and busbw, step table, time split, crossover sizes and a timeline;
    --sweep adds nccl-tests' size table (size, count, type, redop, time, algbw, busbw)."""
    try:
        check_output_file(trace, "trace")
        x = explain(op, algo, ranks, parse_size(nbytes, "bytes"), preset, alpha_us, bandwidth_gbps, gamma_gbps)
        rows = None
        if sweep:
            lo, hi = parse_size(min_bytes, "min-bytes"), parse_size(max_bytes, "max-bytes")
            if lo < 1 or hi < lo:
                raise InputError("max-bytes: must be >= min-bytes >= 1")
            if factor < 2:
                raise InputError("factor: must be >= 2")
            rows = explain_sweep(op, algo, ranks, geometric_sizes(lo, hi, factor), preset, alpha_us, bandwidth_gbps,
                                 gamma_gbps)
    except SimdistError as e:
        _fail(str(e))
        return
    wrote = trace is None or write_output(
        lambda: write_chrome_trace(timeline_report([x.simulation], f"{x.op}/{x.algo}"), trace), trace, "trace")
    trace_path = str(trace) if trace is not None and wrote else None
    if json_out:
        typer.echo(dumps(view.explanation_json(x, trace_path, rows), indent=1))
    else:
        view.print_explanation(x, trace_path)
        if rows is not None:
            say("")
            view.print_sweep(rows, x)
    if not wrote:
        raise typer.Exit(int(ExitCode.BAD_INPUT))


# =========================================================================== calibrate
def calibrate_cmd(
    out: Annotated[Path, typer.Option(help="where to write the profile JSON (CostModel/topology.profile read it)")] = Path(
        "out/host-profile.json"),
    json_out: Annotated[bool, typer.Option("--json", help="print the primitives as JSON")] = False,
) -> None:
    """Measure the primitives of the Gloo model once (p2p messages both ways, one and two in
    flight; the fixed cost of a ProcessGroupGloo call; reduction and copy throughput; the
    cores) and save them as a profile: every collective at any world size is then predicted
    from Gloo's message programs (`simdist.network.gloo_time`), nothing fitted per op."""
    from real_backend.calibrate import calibrate_host

    try:
        check_output_file(out, "out")
    except InputError as e:
        _fail(str(e))
        return
    try:
        host = calibrate_host()
    except (RuntimeError, TimeoutError) as e:
        _fail(_first_line(e), 1)
        return
    if not write_output(lambda: Profile(host=host).save(out), out, "out"):
        raise typer.Exit(int(ExitCode.BAD_INPUT))
    if json_out:
        typer.echo(dumps(host.to_dict(), indent=1))
    else:
        typer.echo(f"cores {host.cores}, call {host.call_s * 1e6:.1f} us, reduction {1 / host.gamma / 1e9:.2f} GB/s, "
                   f"copy {1 / host.copy / 1e9:.2f} GB/s")
        for n, t in zip(host.sizes, host.one_way_s, strict=True):
            typer.echo(f"  message {n:>9} B: one way {t * 1e6:10.1f} us, two in flight "
                       f"{host.exchange_s[host.sizes.index(n)] * 1e6:10.1f} us")
        if host.ring_s:
            typer.echo("ring step, more ranks than cores (each rank sends to the next at once): " + ", ".join(
                f"{p} ranks {v * 1e6:.1f} us" for p, v in sorted(host.ring_s.items(), key=lambda kv: int(kv[0]))))
        if host.cpu_s:
            typer.echo("CPU of the whole rank process (what ranks outnumbering cores share): " + ", ".join(
                f"{k} {v * 1e6:.1f} us" for k, v in sorted(host.cpu_s.items())))
        worst = max(host.spread, key=host.spread.get, default=None)
        if worst is not None:
            typer.echo(f"largest spread between blocks, (p75-p25)/median: {worst} {host.spread[worst]:.2f}" + (
                "  (noisy: the machine is busy; calibrate again when it is quiet)" if host.spread[worst] > 0.1 else ""))
        typer.echo(f"wrote {out}")


# =========================================================================== mounting
def register(target: typer.Typer) -> None:
    """Add bench / compare-timing / explain / calibrate as top-level commands of `target`."""
    target.command("bench")(bench_cmd)
    target.command("compare-timing")(compare_timing_cmd)
    target.command("explain")(explain_cmd)
    target.command("calibrate")(calibrate_cmd)


register(app)
