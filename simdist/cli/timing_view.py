"""How the timing commands print: tables, the explanation's text and JSON, the timeline.

The commands in `simdist.cli.timing` compute nothing here; these functions turn the
results of `real_backend.bench`, `simdist.timing.experiments` and
`simdist.timing.explain` into what a person reads.
"""

from __future__ import annotations

from dataclasses import fields

from rich.table import Table

from simdist.cli.console import out
from simdist.network.simulate import CollectiveResult
from simdist.timing.explain import Explanation


def human_bytes(n: float) -> str:
    for unit, k in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if n >= k:
            v = n / k
            return f"{v:.0f} {unit}" if v == int(v) else f"{v:.2f} {unit}"
    return f"{int(n)} B"


def human_time(t: float) -> str:
    if t >= 1:
        return f"{t:.3f} s"
    if t >= 1e-3:
        return f"{t * 1e3:.3f} ms"
    return f"{t * 1e6:.2f} us"


def _g(x: float) -> str:
    return f"{x:.4g}"


def _bw(per_byte: float) -> str:
    if per_byte <= 0:
        return "0"
    return f"(1/{1 / per_byte / 1e9:.4g} GB/s)"


def _gbps(per_byte: float) -> str:
    return f"1/{(1 / per_byte / 1e9) if per_byte else float('inf'):.4g} GB/s"


# =========================================================================== bench, compare-timing
def print_bench(rows: list, backend: str, ranks: int, repeats: int) -> None:
    """nccl-tests' table: one row per op and size."""
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
    out.print(t)


def print_compare(res: dict) -> None:
    """Held-out sizes with their errors, the regimes found, the closed forms, the verdict."""
    con = out
    t = Table(
        title=f"{res['op']} on {res['backend']}, {res['ranks']} ranks: held-out sizes (statistic {res['stat']}, {res['sweeps']} sweeps)"
    )
    for c in ("size", "measured", "simulated", "rel. error"):
        t.add_column(c, justify="right")
    for r in res["sizes"]:
        t.add_row(
            human_bytes(r["nbytes"]),
            human_time(r["measured_s"]),
            human_time(r["simulated_s"]),
            f"{r['rel_error'] * 100:+.1f}%",
        )
    con.print(t)
    bps = ", ".join(human_bytes(b) for b in res["gloo"]["breakpoints_bytes"]) or "none"
    con.print(
        f"regime breakpoints found: {bps}; gloo ring segment threshold: {human_bytes(res['gloo']['segment_threshold_bytes'][0])}"
    )
    algo = ", ".join(f"{a} {e * 100:.1f}%" for a, e in res["algo_median_abs_error"].items())
    con.print(f"single closed forms with fitted alpha/beta (held-out median |error|): {algo}")
    verdict = "OK" if res["ok"] else "MISSED"
    con.print(
        f"median |error| {res['median_abs_error'] * 100:.1f}%  worst {res['worst_abs_error'] * 100:.1f}%  "
        f"target {res['max_error'] * 100:.0f}%: {verdict}   plot: {res['plot']}"
    )


# =========================================================================== explain
def filled_formula(x: Explanation) -> str:
    """The closed form with this p's coefficients and the parameters written in."""
    c = x.coefficients
    return (
        f"{_g(c.alpha)}·{human_time(x.alpha_s)} + {_g(c.beta_per_byte)}·{x.nbytes} B·{_bw(x.beta_s_per_byte)} + "
        f"{_g(c.gamma_per_byte)}·{x.nbytes} B·{_bw(x.gamma_s_per_byte)}"
    )


def ascii_timeline(res: CollectiveResult, p: int, width: int = 64) -> list[str]:
    """One line per rank (the first 8 and last 4 beyond 16 ranks); a character is a slice
    of time, marked with the step of the message the rank sends then."""
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
    rows.append(f"         0{' ' * (width - len(human_time(end)))}{human_time(end)}")
    return rows


def explanation_json(x: Explanation, trace: str | None) -> dict:
    """The explanation's numbers, with the filled formula, the timeline and the trace path."""
    out = {}
    for k, v in x.to_dict().items():
        out[k] = v
        if k == "coefficients":
            out["filled"] = filled_formula(x)
    out["timeline"] = ascii_timeline(x.simulation, x.ranks)
    out["trace"] = trace
    return out


def render_explanation(x: Explanation, trace: str | None) -> str:
    """The text of `simdist explain`."""
    lines = _formula_lines(x)
    lines += ["", "Where the time goes:"]
    tot = x.time_s or 1e-300
    for f in fields(x.breakdown_s):
        v = getattr(x.breakdown_s, f.name)
        bar = "#" * int(round(40 * v / tot)) if tot > 0 else ""
        lines.append(f"  {f.name:<10} {human_time(v):>12} {100 * v / tot:5.1f}%  {bar}")
    lines += [""] + _step_lines(x) + [""]
    lines.append("Other algorithms at this size, and the crossover size where the faster one changes:")
    for name, o in x.others.items():
        cx = o.crossover_bytes
        where = f"crossover at {human_bytes(cx)} ({cx} B)" if cx is not None else "no crossover between 1 B and 1 TiB"
        lines.append(f"  {name:<20} {human_time(o.time_s):>12}   {where}")
    lines.append("")
    lines.append("Timeline (each character column is a slice of time; digits = step of the message a rank sends):")
    lines.extend("  " + s for s in ascii_timeline(x.simulation, x.ranks))
    if trace:
        lines.append(f"Chrome trace written to {trace} (open in chrome://tracing or ui.perfetto.dev)")
    return "\n".join(lines)


def _formula_lines(x: Explanation) -> list[str]:
    c = x.coefficients
    lines = [
        f"{x.op} / {x.algo} on p = {x.ranks} ranks, n = {x.nbytes} B ({human_bytes(x.nbytes)}) per rank",
        f"  {x.description}",
        f"  parameters ({x.preset}): alpha = {human_time(x.alpha_s)}, "
        f"beta = {_gbps(x.beta_s_per_byte)}, gamma = {_gbps(x.gamma_s_per_byte)}",
        "",
        "Formula (p a power of two):",
        f"  T = {x.formula}",
        f"  for p = {x.ranks}: T = {_g(c.alpha)}·α + {_g(c.beta_per_byte)}·n·β + {_g(c.gamma_per_byte)}·n·γ",
        f"    = {filled_formula(x)}",
        f"    = {human_time(x.time_s)}   (step-level simulation: {human_time(x.simulated_s)})",
    ]
    if x.busbw_gbps is not None:
        lines.append(f"  busbw = {x.busbw_gbps:.3f} GB/s (nccl-tests convention)")
    return lines


def _step_lines(x: Explanation) -> list[str]:
    lines = [
        f"Steps ({len(x.steps)} steps, {x.messages} messages, {x.bytes_on_wire} bytes on the wire in total):",
        f"  {'step':>4}  {'phase':<26} {'msgs':>5} {'bytes/msg':>10} {'red':>3} {'time':>11} {'ends at':>11}  pairs",
    ]
    shown = x.steps if len(x.steps) <= 24 else x.steps[:12] + [None] + x.steps[-11:]
    for s in shown:
        if s is None:
            lines.append("   ...")
            continue
        pairs = " ".join(f"{a}->{b}" for a, b in s.pairs[:4]) + (" ..." if s.messages > 4 else "")
        lines.append(
            f"  {s.step:>4}  {s.phase[:26]:<26} {s.messages:>5} {s.max_bytes:>10} {'yes' if s.reduce else '':>3} "
            f"{human_time(s.time_s):>11} {human_time(s.end_s):>11}  {pairs}"
        )
    return lines
