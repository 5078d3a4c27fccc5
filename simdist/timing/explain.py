"""One collective's cost taken apart: what `simdist explain` shows, as typed data.

For an op, an algorithm (or "auto"), p ranks and n bytes on a uniform network, the
`Explanation` holds the closed form with its coefficients and the time it gives, how
that time splits into latency, bandwidth and reduction, the step table of the schedule
run without contention, the other algorithms with the size where the faster one
changes, and the step-level simulation of the schedule (the timeline). The CLI only
prints it; a script can read the numbers.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field, fields, is_dataclass

from simdist.collectives.algorithms import REGISTRY, Algorithm, Terms, TimeSplit, algorithms_for, make_schedule, resolve
from simdist.collectives.execute import StepTimes, run_times
from simdist.collectives.schedule import Schedule
from simdist.errors import InputError, SimdistError
from simdist.network.cost import CostModel
from simdist.network.simulate import CollectiveRequest, CollectiveResult, simulate
from simdist.network.topology import preset_network
from simdist.timing.sweeps import algbw_bytes, bus_factor, bus_factor_text, dtype_count
from simdist.vocab import REDUCING_OPS

MAX_RANKS = 4096
CROSSOVER_RANGE = (1.0, float(1 << 40))  # bytes searched for a crossover: 1 B .. 1 TiB


@dataclass(frozen=True)
class Coefficients:
    """T = alpha*ca + n*(kb*beta + kg*gamma) for this p: (ca, kb, kg)."""

    alpha: float
    beta_per_byte: float
    gamma_per_byte: float


@dataclass(frozen=True)
class Step:
    """One step of the schedule, run without contention (times in seconds)."""

    step: int
    phase: str
    messages: int
    pairs: list[tuple[int, int]]  # the first 8 (src, dst) pairs
    max_bytes: int
    reduce: bool
    time_s: float
    end_s: float


@dataclass(frozen=True)
class StepGroup:
    """Consecutive steps of the same shape: steps `first`..`last`, `typical` their median step."""

    first: int
    last: int
    count: int
    typical: Step
    time_s: float  # all of them together
    end_s: float  # when the last ends


@dataclass(frozen=True)
class Alternative:
    """Another algorithm for the same op: its time at this size, and the size where the
    faster of it and the explained one changes (None when it does not in 1 B .. 1 TiB)."""

    time_s: float
    crossover_bytes: int | None


@dataclass(frozen=True)
class Explanation:
    op: str
    algo: str
    ranks: int
    nbytes: int
    preset: str
    alpha_s: float
    beta_s_per_byte: float
    gamma_s_per_byte: float
    formula: str  # the closed form evaluated for this p (folded or general where p needs it)
    formula_note: str  # what the schedule does for this p when that differs from the power-of-two case
    symbols: dict[str, int]  # values of the formula's other symbols (p' and r), when it has them
    textbook_formula: str  # the power-of-two form, as the literature writes it
    description: str
    coefficients: Coefficients
    time_s: float  # the closed form
    breakdown_s: TimeSplit
    steps: list[Step]
    step_groups: list[StepGroup]  # runs of steps of the same shape (what a long step table is summarised by)
    bytes_on_wire: int
    messages: int
    simulated_s: float  # the step-level simulation (equals time_s when blocks divide evenly)
    others: dict[str, Alternative]
    algbw_bytes: int  # S in algbw = S / t (nccl-tests: all_gather's whole gathered buffer)
    algbw_gbps: float | None
    bus_factor: float  # busbw = algbw * bus_factor (nccl-tests' PERFORMANCE.md)
    bus_factor_formula: str  # the factor in p, e.g. 2(p-1)/p
    busbw_gbps: float | None
    simulation: CollectiveResult = field(repr=False)  # the timeline: every transfer's begin and end

    def to_dict(self) -> dict:
        """The numbers as JSON-ready data (the simulation's transfers left out)."""
        return {f.name: _plain(getattr(self, f.name)) for f in fields(self) if f.name != "simulation"}


def explain(
    op: str,
    algo: str = "auto",
    ranks: int = 4,
    nbytes: int = 1 << 20,
    preset: str = "loopback",
    alpha_us: float | None = None,
    bandwidth_gbps: float | None = None,
    gamma_gbps: float | None = None,
) -> Explanation:
    """Explain `op` on `ranks` ranks with `nbytes` per rank, on a preset's uniform costs
    or the alpha/beta/gamma given. Raises InputError (or ScenarioError for op and algo)
    naming the argument."""
    if ranks < 1 or ranks > MAX_RANKS:
        raise InputError(f"ranks: must be between 1 and {MAX_RANKS}")
    for name, v in (("alpha-us", alpha_us), ("bandwidth-gbps", bandwidth_gbps), ("gamma-gbps", gamma_gbps)):
        if v is not None and v <= 0:
            raise InputError(f"{name}: must be > 0")
    chosen = resolve(op, algo, "algo", op_field="op")
    alpha, beta, gamma = _parameters(preset, ranks, alpha_us, bandwidth_gbps, gamma_gbps)
    cm = CostModel.from_params(ranks, alpha, beta, gamma)
    name = chosen if chosen is not None else cm.choose(op, nbytes, ranks)
    a = REGISTRY[(op, name)]
    ca, kb, kg = a.coeffs(ranks)
    terms, note = a.terms_for(ranks)
    total = a.time(ranks, nbytes, alpha, beta, gamma)
    s_bytes = algbw_bytes(op, nbytes, ranks)
    algbw = s_bytes / total / 1e9 if total > 0 and op != "barrier" else None
    sched = make_schedule(op, name, ranks, nbytes, 0)
    _, log = run_times(sched, lambda i, j: (alpha, beta), gamma)
    steps = _steps(sched, log)
    res = simulate(cm.network, [CollectiveRequest(op, nbytes, list(range(ranks)), algo=name, name=f"{op}/{name}")])
    others = {
        other: Alternative(
            REGISTRY[(op, other)].time(ranks, nbytes, alpha, beta, gamma),
            crossover(a, REGISTRY[(op, other)], ranks, alpha, beta, gamma),
        )
        for other in algorithms_for(op)
        if other != name
    }
    return Explanation(
        op=op,
        algo=name,
        ranks=ranks,
        nbytes=nbytes,
        preset=preset,
        alpha_s=alpha,
        beta_s_per_byte=beta,
        gamma_s_per_byte=gamma,
        formula=render_formula(terms),
        formula_note=note,
        symbols=_symbols(terms, ranks),
        textbook_formula=a.formula,
        description=a.description,
        coefficients=Coefficients(ca, kb, kg),
        time_s=total,
        breakdown_s=a.split(ranks, nbytes, alpha, beta, gamma),
        steps=steps,
        step_groups=step_groups(steps),
        bytes_on_wire=sched.units_sent,
        messages=sched.messages,
        simulated_s=res[0].duration,
        others=others,
        algbw_bytes=s_bytes,
        algbw_gbps=algbw,
        bus_factor=bus_factor(op, ranks),
        bus_factor_formula=bus_factor_text(op),
        busbw_gbps=algbw * bus_factor(op, ranks) if algbw is not None else None,
        simulation=res[0],
    )


def _plain(v):
    """A field's value as JSON-ready data (dataclasses as dicts, as `dataclasses.asdict`)."""
    if is_dataclass(v):
        return asdict(v)  # type: ignore[arg-type]
    if isinstance(v, list):
        return [_plain(x) for x in v]
    if isinstance(v, dict):
        return {k: _plain(x) for k, x in v.items()}
    return v


def _parameters(
    preset: str, ranks: int, alpha_us: float | None, bandwidth_gbps: float | None, gamma_gbps: float | None
) -> tuple[float, float, float]:
    """(alpha s, beta s/byte, gamma s/byte): the preset's uniform costs, overridden."""
    try:
        base = preset_network(preset, ranks)
    except SimdistError as e:
        raise InputError(str(e).replace("topology.preset:", "preset:", 1)) from None
    a0, b0 = base.uniform_params() if ranks > 1 else (0.0, 0.0)
    if ranks > 1 and not base.is_uniform() and alpha_us is None and bandwidth_gbps is None:
        raise InputError(
            f"preset: '{preset}' is not uniform (costs differ between pairs); give --alpha-us and --bandwidth-gbps, or use loopback/switch8"
        )
    alpha = a0 if alpha_us is None else alpha_us * 1e-6
    beta = b0 if bandwidth_gbps is None else 1 / (bandwidth_gbps * 1e9)
    gamma = base.gamma if gamma_gbps is None else 1 / (gamma_gbps * 1e9)
    return alpha, beta, gamma


def _steps(sched: Schedule, log: StepTimes) -> list[Step]:
    """The step table from the no-contention run's transfers."""
    steps = []
    prev_end = 0.0
    for k, st in enumerate(sched.steps):
        end = log.step_end[k]
        n = min(len(st), 8)
        steps.append(Step(k, sched.phases[k], len(st), list(zip(st.src[:n].tolist(), st.dst[:n].tolist(), strict=True)),
                          int(st.count.max()), bool(st.reduce.any()), end - prev_end, end))
        prev_end = end
    return steps


def step_groups(steps: list[Step]) -> list[StepGroup]:
    """Consecutive steps of the same shape (phase, messages, bytes per message, reduce),
    one group each: a ring's p - 1 steps per phase are two groups, whatever p is."""
    groups: list[list[Step]] = []
    for st in steps:
        g = groups[-1] if groups else None
        if g and (g[0].phase, g[0].messages, g[0].max_bytes, g[0].reduce) == (st.phase, st.messages, st.max_bytes,
                                                                             st.reduce):
            g.append(st)
        else:
            groups.append([st])
    out = []
    for g in groups:
        typical = sorted(g, key=lambda s: (s.time_s, s.step))[len(g) // 2]  # the median step
        out.append(StepGroup(g[0].step, g[-1].step, len(g), typical, sum(s.time_s for s in g), g[-1].end_s))
    return out


def crossover(a: Algorithm, b: Algorithm, p: int, alpha: float, beta: float, gamma: float) -> int | None:
    """Smallest whole size in [1 B, 1 TiB] from which the faster of a and b is the other one,
    if any. Both times are affine in n (T = fixed + n * per_byte), so the sizes where they are
    equal solve a linear equation: no search needed."""
    fa, fb = a.time(p, 0, alpha, beta, gamma), b.time(p, 0, alpha, beta, gamma)
    sa, sb = a.time(p, 1, alpha, beta, gamma) - fa, b.time(p, 1, alpha, beta, gamma) - fb
    if sa == sb:
        return None  # parallel lines: one is faster everywhere (or they are equal)
    n = (fb - fa) / (sa - sb)
    lo, hi = CROSSOVER_RANGE
    return math.ceil(n) if lo < n < hi else None


def render_formula(terms: Terms) -> str:
    """T = a·α + b·n·β + c·n·γ from coefficient texts, zero terms left out."""
    parts = []
    for text, symbol in zip(terms, ("α", "n·β", "n·γ"), strict=True):
        if text == "0":
            continue
        factor = f"({text})" if _has_top_level_sum(text) or text.startswith("Σ") else text
        parts.append(symbol if text == "1" else f"{factor}·{symbol}")
    return " + ".join(parts) or "0"


def _has_top_level_sum(text: str) -> bool:
    """Does `text` add or subtract outside parentheses (so it needs them as a factor)?"""
    depth = 0
    for i, ch in enumerate(text):
        depth += ch == "("
        depth -= ch == ")"
        if depth == 0 and ch in "+-" and text[i - 1:i] == " ":
            return True
    return False


def _symbols(terms: Terms, p: int) -> dict[str, int]:
    """p' = 2^⌊lg p⌋ and r = p - p' when the formula uses them (a folded one)."""
    q = 1 << (p.bit_length() - 1)
    text = " ".join(terms)
    return {"p'": q, "r": p - q} if ("p'" in text or "min(r" in text) else {}


# =========================================================================== sweep
@dataclass(frozen=True)
class SweepRow:
    """One size of `simdist explain --sweep`, in nccl-tests' columns."""

    size: int  # S: bytes per rank (all_gather: the gathered buffer, p times the contribution)
    count: int  # elements of `type` in S
    type: str
    redop: str  # "sum" for reducing collectives, "none" otherwise
    algo: str
    time_s: float  # the closed form's time
    algbw_gbps: float | None
    busbw_gbps: float | None


def sweep(op: str, algo: str, ranks: int, sizes: list[int], preset: str = "loopback", alpha_us: float | None = None,
          bandwidth_gbps: float | None = None, gamma_gbps: float | None = None, dtype: str = "float32") -> list[SweepRow]:
    """The cost model's predicted time, algbw and busbw per size (`sizes`: bytes per rank, n)."""
    chosen = resolve(op, algo, "algo", op_field="op")
    if ranks < 1 or ranks > MAX_RANKS:
        raise InputError(f"ranks: must be between 1 and {MAX_RANKS}")
    alpha, beta, gamma = _parameters(preset, ranks, alpha_us, bandwidth_gbps, gamma_gbps)
    cm = CostModel.from_params(ranks, alpha, beta, gamma)
    rows = []
    for n in sizes:
        name = chosen if chosen is not None else cm.choose(op, n, ranks)
        t = REGISTRY[(op, name)].time(ranks, n, alpha, beta, gamma)
        s_bytes = algbw_bytes(op, n, ranks)
        algbw = s_bytes / t / 1e9 if t > 0 and op != "barrier" else None
        rows.append(SweepRow(s_bytes, dtype_count(s_bytes, dtype), "float" if dtype == "float32" else dtype,
                             "sum" if op in REDUCING_OPS else "none", name, t, algbw,
                             algbw * bus_factor(op, ranks) if algbw is not None else None))
    return rows
