"""How the timing commands print: tables, the explanation's text and JSON, the timeline.

The commands in `simdist.cli.timing` compute nothing here; these functions turn the
results of `real_backend.bench`, `simdist.timing.experiments` and
`simdist.timing.explain` into what a person reads.
"""

from __future__ import annotations

from dataclasses import asdict, fields

import numpy as np
from rich.table import Table

from simdist.cli.console import say, show, table
from simdist.network.simulate import CollectiveResult
from simdist.timing.explain import Explanation, SweepRow
from simdist.vocab import REDUCING_OPS


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
    t = table("op", "size", "count", "type", "redop", "time (us)", "algbw (GB/s)", "busbw (GB/s)", "iters",
              title=f"{backend} bench, {ranks} ranks (median of {repeats} batches; slowest rank)", justify="right",
              no_wrap=True)
    for r in rows:
        t.add_row(r.op, str(r.nbytes), str(r.count), "float", "sum" if r.op in REDUCING_OPS else "none",
                  f"{r.time_s * 1e6:.1f}", f"{r.algbw_gbps:.3f}", f"{r.busbw_gbps:.3f}", str(r.iters))
    show(t)


def print_compare(res: dict) -> None:
    """Held-out sizes with their errors, the regimes found, the closed forms, the verdict."""
    t = table("size", "measured", "simulated", "rel. error", justify="right",
              title=f"{res['op']} on {res['backend']}, {res['ranks']} ranks: held-out sizes "
                    f"(statistic {res['stat']}, {res['sweeps']} sweeps)")
    for r in res["sizes"]:
        t.add_row(
            human_bytes(r["nbytes"]),
            human_time(r["measured_s"]),
            human_time(r["simulated_s"]),
            f"{r['rel_error'] * 100:+.1f}%",
        )
    show(t)
    bps = ", ".join(human_bytes(b) for b in res["gloo"]["breakpoints_bytes"]) or "none"
    say(f"regime breakpoints found: {bps}; gloo ring segment threshold: "
        f"{human_bytes(res['gloo']['segment_threshold_bytes'][0])}")
    algo = ", ".join(f"{a} {e * 100:.1f}%" for a, e in res["algo_median_abs_error"].items())
    say(f"single closed forms with fitted alpha/beta (held-out median |error|): {algo}")
    verdict = "OK" if res["ok"] else "MISSED"
    say(f"median |error| {res['median_abs_error'] * 100:.1f}%  worst {res['worst_abs_error'] * 100:.1f}%  "
        f"target {res['max_error'] * 100:.0f}%: {verdict}   plot: {res['plot']}")


# =========================================================================== explain
def filled_formula(x: Explanation) -> str:
    """The closed form with this p's coefficients and the parameters written in."""
    c = x.coefficients
    return (
        f"{_g(c.alpha)}·{human_time(x.alpha_s)} + {_g(c.beta_per_byte)}·{x.nbytes} B·{_bw(x.beta_s_per_byte)} + "
        f"{_g(c.gamma_per_byte)}·{x.nbytes} B·{_bw(x.gamma_s_per_byte)}"
    )


MARKS = "0123456789abcdefghijklmnopqrstuvwxyz"


def ascii_timeline(res: CollectiveResult, p: int, width: int = 64) -> list[str]:
    """One line per rank (the first 8 and last 4 beyond 16 ranks); a character is a slice
    of time, marked with the step of the message the rank sends then, or with its phase's
    letter when there are more steps than marks (a legend line says which)."""
    end = res.finish or 1e-30
    show = list(range(p)) if p <= 16 else list(range(8)) + list(range(p - 4, p))
    log = res.transfers
    nsteps = len(log.phases)
    by_phase = nsteps > len(MARKS)
    legend = _phase_marks(log.phases) if by_phase else {}
    mark_of = [legend[ph] for ph in log.phases] if by_phase else [MARKS[k % len(MARKS)] for k in range(nsteps)]
    sent = log.sent_by(show)
    first = np.minimum((sent.begin / end * width).astype(np.int64), width)
    last = np.minimum(np.maximum(first + 1, (sent.end / end * width).astype(np.int64)), width)
    w = max(3, len(str(p - 1)))
    rows = []
    for r in show:
        if p > 16 and r == p - 4:
            rows.append(f"{'...':>{5 + w}} |{f'{p - 12} more ranks'.center(width)}|")
        mine = np.flatnonzero(sent.src == r)
        top = _paint(first[mine], last[mine], width)  # the message drawn in each column, -1: none
        line = "".join(mark_of[int(sent.step[mine[i]])] if i >= 0 else " " for i in top.tolist())
        rows.append(f"rank {r:>{w}} |{line}|")
    pad = " " * (6 + w)
    rows.append(f"{pad}0{' ' * (width - len(human_time(end)))}{human_time(end)}")
    if by_phase:
        rows.append(f"{pad}marks: " + ", ".join(f"{m} = {ph or 'steps'}" for ph, m in legend.items()))
    return rows


def _paint(first: np.ndarray, last: np.ndarray, width: int) -> np.ndarray:
    """Per column, the last message (in log order) whose span [first, last) covers it; -1 if none."""
    spans = np.maximum(last - first, 0)
    starts = np.cumsum(spans) - spans
    cols = np.repeat(first, spans) + (np.arange(int(spans.sum())) - np.repeat(starts, spans))
    top = np.full(width, -1)
    np.maximum.at(top, cols, np.repeat(np.arange(len(first)), spans))
    return top


def _phase_marks(phases: list[str]) -> dict[str, str]:
    """A letter per phase (its initial where free), in order of appearance."""
    out: dict[str, str] = {}
    for ph in phases:
        if ph not in out:
            free = [c for c in (ph[:1].lower(), *MARKS[10:], *MARKS[:10]) if c and c in MARKS and c not in out.values()]
            out[ph] = free[0] if free else "?"
    return out


def explanation_json(x: Explanation, trace: str | None, sweep: list[SweepRow] | None = None) -> dict:
    """The explanation's numbers, with the filled formula, the timeline, the trace path and the sweep."""
    out = {}
    for k, v in x.to_dict().items():
        out[k] = v
        if k == "coefficients":
            out["filled"] = filled_formula(x)
    out["timeline"] = ascii_timeline(x.simulation, x.ranks)
    out["trace"] = trace
    if sweep is not None:
        out["sweep"] = [asdict(r) for r in sweep]
    return out


def print_explanation(x: Explanation, trace: str | None) -> None:
    """What `simdist explain` prints: the formula it evaluated, bandwidths, time split, steps,
    the other algorithms, the timeline."""
    for line in _formula_lines(x) + _bandwidth_lines(x):
        say(line)
    say("")
    say("Where the time goes:")
    tot = x.time_s or 1e-300
    t = table("term", "time", "share", "", title=None)
    for f in fields(x.breakdown_s):
        v = getattr(x.breakdown_s, f.name)
        t.add_row(f.name, human_time(v), f"{100 * v / tot:5.1f}%", "#" * int(round(40 * v / tot)))
    show(t)
    say("")
    summary = "; the first and last, and a typical step of each run of like steps" if len(x.steps) > STEP_ROWS else ""
    say(f"Steps ({len(x.steps)} steps, {x.messages} messages, {x.bytes_on_wire} bytes on the wire in total{summary}):")
    show(_step_table(x))
    say("")
    say("Other algorithms at this size, and the crossover size where the faster one changes:")
    t = table("algorithm", "time", "crossover")
    for name, o in x.others.items():
        cx = o.crossover_bytes
        t.add_row(name, human_time(o.time_s),
                  f"at {human_bytes(cx)} ({cx} B)" if cx is not None else "none between 1 B and 1 TiB")
    show(t)
    say("")
    what = "letter = phase" if len(x.steps) > len(MARKS) else "digits = step"
    say(f"Timeline (each character column is a slice of time; {what} of the message a rank sends):")
    for line in ascii_timeline(x.simulation, x.ranks):
        say("  " + line)
    if trace:
        say(f"Chrome trace written to {trace} (open in chrome://tracing or ui.perfetto.dev)")


def _formula_lines(x: Explanation) -> list[str]:
    c = x.coefficients
    special = bool(x.formula_note)
    symbols = "; " + ", ".join(f"{k} = {v}" for k, v in x.symbols.items()) if x.symbols else ""
    head = f"Formula (p = {x.ranks} is not a power of two{symbols}):" if special else "Formula:"
    lines = [
        f"{x.op} / {x.algo} on p = {x.ranks} ranks, n = {x.nbytes} B ({human_bytes(x.nbytes)}) per rank",
        f"  {x.description}",
        f"  parameters ({x.preset}): alpha = {human_time(x.alpha_s)}, "
        f"beta = {_gbps(x.beta_s_per_byte)}, gamma = {_gbps(x.gamma_s_per_byte)}",
        "",
        head,
        f"  T = {x.formula}",
    ]
    if special:
        lines.append(f"  what the schedule does: {x.formula_note}")
        lines.append(f"  (for a power of two the textbook form: T = {x.textbook_formula})")
    lines += [
        f"  for p = {x.ranks}: T = {_g(c.alpha)}·α + {_g(c.beta_per_byte)}·n·β + {_g(c.gamma_per_byte)}·n·γ",
        f"    = {filled_formula(x)}",
        f"    = {human_time(x.time_s)}   (step-level simulation: {human_time(x.simulated_s)})",
    ]
    return lines


def _bandwidth_lines(x: Explanation) -> list[str]:
    """algbw and busbw as nccl-tests defines them (doc/PERFORMANCE.md), and how one gives the other."""
    if x.algbw_gbps is None or x.busbw_gbps is None:
        return []
    what = "p·n, the gathered buffer" if x.op == "all_gather" else "n, the per-rank buffer"
    return [
        "",
        "Bandwidth (nccl-tests' conventions, doc/PERFORMANCE.md):",
        f"  algbw = S / t = {x.algbw_bytes} B / {human_time(x.time_s)} = {x.algbw_gbps:.4g} GB/s   (S = {what})",
        f"  busbw = algbw · {x.bus_factor_formula} = algbw · {_g(x.bus_factor)} = {x.busbw_gbps:.4g} GB/s",
        f"  the bus factor {x.bus_factor_formula} is the share of S each rank's link carries in an optimal ring, so "
        f"busbw compares with the link's 1/β = {1 / x.beta_s_per_byte / 1e9 if x.beta_s_per_byte else float('inf'):.4g} "
        "GB/s whatever p is",
    ]


STEP_ROWS = 24  # a longer step table is summarised
EDGE_STEPS = 4  # steps shown at each end of a summarised table


def _step_table(x: Explanation) -> Table:
    """Every step when there are few; otherwise the first and last steps, and between them
    a typical step of each run of like steps (a ring's phases), or of them all when the
    runs are many."""
    t = table("step", "phase", "msgs", "bytes/msg", "reduce", "time", "ends at", "pairs")
    n = len(x.steps)
    if n <= STEP_ROWS:
        for st in x.steps:
            _step_row(t, str(st.step), st.phase, st, human_time(st.time_s), st.end_s)
        return t
    for st in x.steps[:EDGE_STEPS]:
        _step_row(t, str(st.step), st.phase, st, human_time(st.time_s), st.end_s)
    lo, hi = EDGE_STEPS, n - EDGE_STEPS - 1  # the middle steps, summarised
    middle = [(max(g.first, lo), min(g.last, hi), g.typical) for g in x.step_groups if g.last >= lo and g.first <= hi]
    if len(middle) > STEP_ROWS - 2 * EDGE_STEPS:
        typical = sorted(x.steps[lo:hi + 1], key=lambda s: (s.time_s, s.step))[(hi - lo + 1) // 2]
        middle = [(lo, hi, typical)]
    for a, b, typical in middle:
        _step_row(t, f"{a}..{b}", f"{typical.phase} ({b - a + 1} steps; a typical one)", typical,
                  f"{human_time(typical.time_s)} each", x.steps[b].end_s)
    for st in x.steps[-EDGE_STEPS:]:
        _step_row(t, str(st.step), st.phase, st, human_time(st.time_s), st.end_s)
    return t


def _step_row(t: Table, label: str, phase: str, st, time: str, end_s: float) -> None:
    pairs = " ".join(f"{a}->{b}" for a, b in st.pairs[:4]) + (" ..." if st.messages > 4 else "")
    t.add_row(label, phase, str(st.messages), str(st.max_bytes), "yes" if st.reduce else "", time, human_time(end_s),
              pairs)


def print_sweep(rows: list[SweepRow], x: Explanation) -> None:
    """nccl-tests' columns, predicted by the cost model (time = the closed form)."""
    say(f"{x.op} on p = {x.ranks} ranks ({x.preset}: alpha = {human_time(x.alpha_s)}, beta = {_gbps(x.beta_s_per_byte)}, "
        f"gamma = {_gbps(x.gamma_s_per_byte)}); busbw = algbw · {x.bus_factor_formula}"
        + ("; size = the gathered buffer, p times the per-rank contribution" if x.op == "all_gather" else ""))
    t = table("size", "count", "type", "redop", "time", "algbw", "busbw", "algo", justify="right")
    t.columns[-1].justify = "left"
    t.add_row("(B)", "(elements)", "", "", "(us)", "(GB/s)", "(GB/s)", "")
    for r in rows:
        t.add_row(str(r.size), str(r.count), r.type, r.redop, f"{r.time_s * 1e6:.2f}",
                  f"{r.algbw_gbps:.3f}" if r.algbw_gbps is not None else "-",
                  f"{r.busbw_gbps:.3f}" if r.busbw_gbps is not None else "-", r.algo)
    show(t)
