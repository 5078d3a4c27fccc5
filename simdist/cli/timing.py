"""`simdist bench`, `simdist compare-timing`, `simdist explain`.

Mount into the main CLI with ``register(app)`` (commands at top level) or
``app.add_typer(timing_cli.app)``. Exit codes: 0 ok, 1 target missed (compare-timing),
2 bad input (one line naming the field, no traceback).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Annotated

import typer

from simdist.cli.console import BadInput, err, fail, parse_size
from simdist.errors import SimdistError

app = typer.Typer(help="Communication cost model: benchmarks, calibration, explanations.", no_args_is_help=True)
_fail = fail  # shared: one line "error: ...", then the exit code (2 unless said)


def _human(n: float) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            v = n / k
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{int(n)} B"


def _fmt_t(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.2f} us"


def _console():
    return err


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
        from simdist.calibrate import _bench

        b = _bench()
        ops = [o.strip() for o in op.split(",") if o.strip()]
        for o in ops:
            if o not in b.BENCH_OPS:
                raise BadInput(f"op: unknown op '{o}' (choose from {', '.join(b.BENCH_OPS)})")
        if backend not in ("gloo", "nccl"):
            raise BadInput(f"backend: unknown backend '{backend}' (choose from gloo, nccl)")
        if ranks < 1:
            raise BadInput("ranks: must be >= 1")
        lo, hi = parse_size(min_bytes, "min-bytes"), parse_size(max_bytes, "max-bytes")
        if lo < 1 or hi < lo:
            raise BadInput("max-bytes: must be >= min-bytes >= 1")
        if factor < 2:
            raise BadInput("factor: must be >= 2")
        if repeats < 1 or warmup < 0:
            raise BadInput("repeats: must be >= 1 (and warmup >= 0)")
        if backend == "nccl":
            import torch

            if not torch.cuda.is_available():
                raise BadInput("backend: nccl needs CUDA, and torch.cuda.is_available() is False here")
            if torch.cuda.device_count() < ranks:
                raise BadInput(f"ranks: nccl needs one GPU per rank, found {torch.cuda.device_count()}")
        sizes, s = [], lo
        while s <= hi:
            sizes.append(s)
            s *= factor
    except BadInput as e:
        _fail(str(e))
        return
    from rich.progress import Progress

    rows = []
    try:
        with Progress(console=_console(), transient=True) as prog:
            for o in ops:
                task = prog.add_task(f"{backend} {o} x{ranks}", total=len(sizes) if o != "barrier" else 1)
                rows += b.run_sweep(
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
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__, 1)
        return
    if out is not None:
        b.save_rows(rows, out)
    if json_out:
        typer.echo(json.dumps([r.to_dict() for r in rows], indent=1))
        return
    from rich.console import Console
    from rich.table import Table

    t = Table(title=f"{backend} bench, {ranks} ranks (median of {repeats} batches; slowest rank)")
    for c in ("op", "size", "count", "type", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "iters"):
        t.add_column(c, justify="right", no_wrap=True, min_width=len(c) if c != "op" else 14)
    for r in rows:
        t.add_row(
            r.op,
            str(r.nbytes),
            str(r.count),
            "float",
            f"{r.time_s * 1e6:.1f}",
            f"{r.algbw_gbps:.3f}",
            f"{r.busbw_gbps:.3f}",
            str(r.iters),
        )
    Console().print(t)
    if out is not None:
        typer.echo(f"wrote {out}")


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
    from simdist import calibrate as cal

    try:
        if backend not in ("gloo", "nccl"):
            raise BadInput(f"backend: unknown backend '{backend}' (choose from gloo, nccl)")
        if ranks < 2:
            raise BadInput("ranks: compare-timing needs at least 2 ranks")
        if op not in cal._bench().BENCH_OPS or op == "barrier":
            raise BadInput(
                f"op: cannot calibrate '{op}' (choose from all_reduce, all_gather, reduce_scatter, broadcast, reduce, all_to_all)"
            )
        if stat not in cal.STAT_CHOICES:
            raise BadInput(f"stat: unknown statistic '{stat}' (choose from {', '.join(cal.STAT_CHOICES)})")
        lo, hi = parse_size(min_bytes, "min-bytes"), parse_size(max_bytes, "max-bytes")
        if lo < 4 or hi < 4 * lo:
            raise BadInput("max-bytes: need min-bytes >= 4 and max-bytes >= 4 * min-bytes")
        if sweeps < 1 or repeats < 1:
            raise BadInput("sweeps: sweeps and repeats must be >= 1")
        if max_error is not None and max_error <= 0:
            raise BadInput("max-error: must be > 0")
        train_rows = test_rows = None
        if load is not None:
            try:
                raw = json.loads(Path(load).read_text())["raw"]
            except (OSError, ValueError, KeyError) as e:
                raise BadInput(f"load: cannot read measurements from {load} ({type(e).__name__})") from None
            B = cal._bench().BenchRow
            train_rows = [[B(**r) for r in sw] for sw in raw["train"]]
            test_rows = [[B(**r) for r in sw] for sw in raw["test"]]
            ranks = train_rows[0][0].world_size
            op = train_rows[0][0].op
            backend = train_rows[0][0].backend
        elif backend == "nccl":
            import torch

            if not torch.cuda.is_available() or torch.cuda.device_count() < ranks:
                raise BadInput("backend: nccl needs CUDA with one GPU per rank")
    except BadInput as e:
        _fail(str(e))
        return
    target = max_error if max_error is not None else (0.10 if ranks <= 2 else 0.20)
    try:
        if train_rows is None:
            from rich.progress import Progress

            with Progress(console=_console(), transient=True) as prog:
                task = prog.add_task(
                    f"{backend} {op} x{ranks}: {sweeps} calibration + {sweeps} held-out sweeps", total=None
                )
                res = cal.run_compare(
                    backend,
                    ranks,
                    op,
                    lo,
                    hi,
                    sweeps=sweeps,
                    repeats=repeats,
                    stat=stat,
                    seed=seed,
                    progress=lambda i, n, row: prog.update(task, completed=i, total=n),
                )
        else:
            res = cal.run_compare(
                backend,
                ranks,
                op,
                stat=stat,
                train_rows=train_rows,
                test_rows=test_rows,
                gamma=json.loads(Path(load).read_text()).get("gamma"),
            )
    except (RuntimeError, TimeoutError) as e:
        _fail(str(e).splitlines()[0] if str(e) else type(e).__name__, 1)
        return
    res["max_error"] = target
    res["ok"] = bool(res["median_abs_error"] <= target)
    plot_path = plot if plot is not None else Path("out") / f"compare-timing-{backend}-p{ranks}.png"
    res["plot"] = str(cal.plot_compare(res, plot_path))
    if save_profile is not None:
        prof = cal.Profile()
        prof.add(cal.OpProfile.from_dict(res["profile"]))
        prof.save(save_profile)
    if save_raw is not None:
        save_raw.parent.mkdir(parents=True, exist_ok=True)
        save_raw.write_text(json.dumps(res, indent=1))
    if json_out:
        typer.echo(json.dumps({k: v for k, v in res.items() if k != "raw"}, indent=1))
    else:
        _print_compare(res)
    if not res["ok"]:
        raise typer.Exit(1)


def _print_compare(res: dict) -> None:
    from rich.console import Console
    from rich.table import Table

    con = Console()
    t = Table(
        title=f"{res['op']} on {res['backend']}, {res['ranks']} ranks: held-out sizes (statistic {res['stat']}, {res['sweeps']} sweeps)"
    )
    for c in ("size", "measured", "simulated", "rel. error"):
        t.add_column(c, justify="right")
    for r in res["sizes"]:
        t.add_row(
            _human(r["nbytes"]), _fmt_t(r["measured_s"]), _fmt_t(r["simulated_s"]), f"{r['rel_error'] * 100:+.1f}%"
        )
    con.print(t)
    bps = ", ".join(_human(b) for b in res["gloo"]["breakpoints_bytes"]) or "none"
    con.print(
        f"regime breakpoints found: {bps}; gloo ring segment threshold: {_human(res['gloo']['segment_threshold_bytes'][0])}"
    )
    algo = ", ".join(f"{a} {e * 100:.1f}%" for a, e in res["algo_median_abs_error"].items())
    con.print(f"single closed forms with fitted alpha/beta (held-out median |error|): {algo}")
    verdict = "OK" if res["ok"] else "MISSED"
    con.print(
        f"median |error| {res['median_abs_error'] * 100:.1f}%  worst {res['worst_abs_error'] * 100:.1f}%  "
        f"target {res['max_error'] * 100:.0f}%: {verdict}   plot: {res['plot']}"
    )


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
) -> None:
    """Formula with numbers, step table, time split, crossover sizes and a timeline."""
    try:
        info = explain(
            op, algo, ranks, parse_size(nbytes, "bytes"), preset, alpha_us, bandwidth_gbps, gamma_gbps, trace
        )
    except SimdistError as e:
        _fail(str(e))
        return
    if json_out:
        typer.echo(json.dumps(info, indent=1))
    else:
        typer.echo(render_explain(info))


def explain(
    op: str,
    algo: str = "auto",
    ranks: int = 4,
    nbytes: int = 1 << 20,
    preset: str = "loopback",
    alpha_us: float | None = None,
    bandwidth_gbps: float | None = None,
    gamma_gbps: float | None = None,
    trace: Path | None = None,
) -> dict:
    """Everything `simdist explain` shows, as a dict."""
    from simdist.collectives.algorithms import REGISTRY, algorithms_for, make_schedule, resolve
    from simdist.collectives.execute import run_times
    from simdist.network.cost import CostModel
    from simdist.network.simulate import CollectiveRequest, simulate, write_chrome_trace
    from simdist.network.topology import preset_network

    if ranks < 1 or ranks > 4096:
        raise BadInput("ranks: must be between 1 and 4096")
    for name, v in (("alpha-us", alpha_us), ("bandwidth-gbps", bandwidth_gbps), ("gamma-gbps", gamma_gbps)):
        if v is not None and v <= 0:
            raise BadInput(f"{name}: must be > 0")
    name = resolve(op, algo, "algo")
    try:
        base = preset_network(preset, ranks)
    except SimdistError as e:
        raise BadInput(str(e).replace("topology.preset:", "preset:", 1)) from None
    a0, b0 = base.uniform_params() if ranks > 1 else (0.0, 0.0)
    if ranks > 1 and not base.is_uniform() and alpha_us is None and bandwidth_gbps is None:
        raise BadInput(
            f"preset: '{preset}' is not uniform (costs differ between pairs); give --alpha-us and --bandwidth-gbps, or use loopback/switch8"
        )
    alpha = a0 if alpha_us is None else alpha_us * 1e-6
    beta = b0 if bandwidth_gbps is None else 1 / (bandwidth_gbps * 1e9)
    gamma = base.gamma if gamma_gbps is None else 1 / (gamma_gbps * 1e9)
    cm = CostModel.from_params(ranks, alpha, beta, gamma)
    if name is None:
        name = cm.choose(op, nbytes, ranks)
    A = REGISTRY[(op, name)]
    ca, kb, kg = A.coeffs(ranks)
    total = A.time(ranks, nbytes, alpha, beta, gamma)
    parts = {"latency": ca * alpha, "bandwidth": nbytes * kb * beta, "reduction": nbytes * kg * gamma}
    sched = make_schedule(op, name, ranks, nbytes, 0)
    fin, log = run_times(sched, lambda i, j: (alpha, beta), gamma, record=True)
    steps = []
    prev_end = 0.0
    for k, st in enumerate(sched.steps):
        ts = [t for t in log if t.step == k]
        end = max(t.end for t in ts)
        steps.append(
            {
                "step": k,
                "phase": sched.phases[k],
                "messages": len(st),
                "pairs": [[t.src, t.dst] for t in st][:8],
                "max_bytes": max(t.count for t in st),
                "reduce": any(t.reduce for t in st),
                "time_s": end - prev_end,
                "end_s": end,
            }
        )
        prev_end = end
    others = {}
    for other in algorithms_for(op):
        if other == name:
            continue
        B = REGISTRY[(op, other)]
        others[other] = {
            "time_s": B.time(ranks, nbytes, alpha, beta, gamma),
            "crossover_bytes": _crossover(A, B, ranks, alpha, beta, gamma),
        }
    res = simulate(cm.network, [CollectiveRequest(op, nbytes, list(range(ranks)), algo=name, name=f"{op}/{name}")])
    trace_path = None
    if trace is not None:
        trace_path = str(write_chrome_trace(res, trace))
    info = {
        "op": op,
        "algo": name,
        "ranks": ranks,
        "nbytes": nbytes,
        "preset": preset,
        "alpha_s": alpha,
        "beta_s_per_byte": beta,
        "gamma_s_per_byte": gamma,
        "formula": A.formula,
        "description": A.description,
        "coefficients": {"alpha": ca, "beta_per_byte": kb, "gamma_per_byte": kg},
        "filled": f"{_g(ca)}·{_fmt_t(alpha)} + {_g(kb)}·{nbytes} B·{_bw(beta)} + {_g(kg)}·{nbytes} B·{_bw(gamma)}",
        "time_s": total,
        "breakdown_s": parts,
        "steps": steps,
        "bytes_on_wire": sched.units_sent,
        "messages": sched.messages,
        "simulated_s": res[0].duration,
        "others": others,
        "busbw_gbps": _busbw(op, nbytes, ranks, total),
        "timeline": _ascii_timeline(res[0], ranks),
        "trace": trace_path,
    }
    return info


def _g(x: float) -> str:
    return f"{x:.4g}"


def _bw(per_byte: float) -> str:
    if per_byte <= 0:
        return "0"
    return f"(1/{1 / per_byte / 1e9:.4g} GB/s)"


def _busbw(op: str, nbytes: int, p: int, t: float) -> float | None:
    if t <= 0 or op == "barrier":
        return None
    from simdist.calibrate import _bench

    b = _bench()
    return b.algbw_bytes(op, nbytes, p) / t / 1e9 * b.bus_factor(op, p)


def _crossover(A, B, p: int, alpha: float, beta: float, gamma: float) -> int | None:
    """Smallest size in [1 B, 1 TiB] where the faster of A, B changes (bisection), if any."""

    def d(n: float) -> float:
        return A.time(p, n, alpha, beta, gamma) - B.time(p, n, alpha, beta, gamma)

    lo, hi = 1.0, float(1 << 40)
    dlo, dhi = d(lo), d(hi)
    if dlo == 0 or dhi == 0 or (dlo > 0) == (dhi > 0):
        return None
    for _ in range(200):
        mid = (lo * hi) ** 0.5
        if (d(mid) > 0) == (dlo > 0):
            lo = mid
        else:
            hi = mid
        if hi - lo < 1:
            break
    return int(round(hi))


def _ascii_timeline(res, p: int, width: int = 64) -> list[str]:
    end = res.finish or 1e-30
    rows = []
    show = list(range(p)) if p <= 16 else list(range(8)) + list(range(p - 4, p))
    marks = "0123456789abcdefghijklmnopqrstuvwxyz"
    for r in show:
        line = [" "] * width
        for t in res.transfers:
            if t.src != r:
                continue
            a = int(t.begin / end * width)
            b = max(a + 1, int(t.end / end * width))
            for x in range(a, min(b, width)):
                line[x] = marks[t.step % len(marks)]
        rows.append(f"rank {r:>3} |{''.join(line)}|")
    rows.append(f"         0{' ' * (width - len(_fmt_t(end)))}{_fmt_t(end)}")
    return rows


def render_explain(info: dict) -> str:
    L = []
    L.append(
        f"{info['op']} / {info['algo']} on p = {info['ranks']} ranks, n = {info['nbytes']} B ({_human(info['nbytes'])}) per rank"
    )
    L.append(f"  {info['description']}")
    L.append(
        f"  parameters ({info['preset']}): alpha = {_fmt_t(info['alpha_s'])}, "
        f"beta = 1/{(1 / info['beta_s_per_byte'] / 1e9) if info['beta_s_per_byte'] else float('inf'):.4g} GB/s, "
        f"gamma = 1/{(1 / info['gamma_s_per_byte'] / 1e9) if info['gamma_s_per_byte'] else float('inf'):.4g} GB/s"
    )
    L.append("")
    L.append("Formula (p a power of two):")
    L.append(f"  T = {info['formula']}")
    c = info["coefficients"]
    L.append(
        f"  for p = {info['ranks']}: T = {_g(c['alpha'])}·α + {_g(c['beta_per_byte'])}·n·β + {_g(c['gamma_per_byte'])}·n·γ"
    )
    L.append(f"    = {info['filled']}")
    L.append(f"    = {_fmt_t(info['time_s'])}   (step-level simulation: {_fmt_t(info['simulated_s'])})")
    if info["busbw_gbps"] is not None:
        L.append(f"  busbw = {info['busbw_gbps']:.3f} GB/s (nccl-tests convention)")
    L.append("")
    L.append("Where the time goes:")
    tot = info["time_s"] or 1e-300
    for k, v in info["breakdown_s"].items():
        bar = "#" * int(round(40 * v / tot)) if tot > 0 else ""
        L.append(f"  {k:<10} {_fmt_t(v):>12} {100 * v / tot:5.1f}%  {bar}")
    L.append("")
    L.append(
        f"Steps ({len(info['steps'])} steps, {info['messages']} messages, {info['bytes_on_wire']} bytes on the wire in total):"
    )
    L.append(
        f"  {'step':>4}  {'phase':<26} {'msgs':>5} {'bytes/msg':>10} {'red':>3} {'time':>11} {'ends at':>11}  pairs"
    )
    steps = info["steps"]
    shown = steps if len(steps) <= 24 else steps[:12] + [None] + steps[-11:]
    for s in shown:
        if s is None:
            L.append("   ...")
            continue
        pairs = " ".join(f"{a}->{b}" for a, b in s["pairs"][:4]) + (" ..." if s["messages"] > 4 else "")
        L.append(
            f"  {s['step']:>4}  {s['phase'][:26]:<26} {s['messages']:>5} {s['max_bytes']:>10} {'yes' if s['reduce'] else '':>3} "
            f"{_fmt_t(s['time_s']):>11} {_fmt_t(s['end_s']):>11}  {pairs}"
        )
    L.append("")
    L.append("Other algorithms at this size, and the crossover size where the faster one changes:")
    for name, o in info["others"].items():
        cx = o["crossover_bytes"]
        where = f"crossover at {_human(cx)} ({cx} B)" if cx is not None else "no crossover between 1 B and 1 TiB"
        L.append(f"  {name:<20} {_fmt_t(o['time_s']):>12}   {where}")
    L.append("")
    L.append("Timeline (each character column is a slice of time; digits = step of the message a rank sends):")
    L.extend("  " + x for x in info["timeline"])
    if info["trace"]:
        L.append(f"Chrome trace written to {info['trace']} (open in chrome://tracing or ui.perfetto.dev)")
    return "\n".join(L)


# =========================================================================== mounting
def register(target: typer.Typer) -> None:
    """Add bench / compare-timing / explain as top-level commands of `target`."""
    target.command("bench")(bench_cmd)
    target.command("compare-timing")(compare_timing_cmd)
    target.command("explain")(explain_cmd)


register(app)
