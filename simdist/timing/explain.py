"""One collective's cost taken apart: what `simdist explain` shows, as typed data.

For an op, an algorithm (or "auto"), p ranks and n bytes on a uniform network, the
`Explanation` holds the closed form with its coefficients and the time it gives, how
that time splits into latency, bandwidth and reduction, the step table of the schedule
run without contention, the other algorithms with the size where the faster one
changes, and the step-level simulation of the schedule (the timeline). The CLI only
prints it; a script can read the numbers.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field

from simdist.collectives.algorithms import REGISTRY, Algorithm, TimeSplit, algorithms_for, make_schedule, resolve
from simdist.collectives.execute import TransferTime, run_times
from simdist.collectives.schedule import Schedule
from simdist.errors import InputError, SimdistError
from simdist.network.cost import CostModel
from simdist.network.simulate import CollectiveRequest, CollectiveResult, simulate
from simdist.network.topology import preset_network
from simdist.timing.sweeps import busbw_gbps

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
    formula: str  # for power-of-two p, as the registry writes it
    description: str
    coefficients: Coefficients
    time_s: float  # the closed form
    breakdown_s: TimeSplit
    steps: list[Step]
    bytes_on_wire: int
    messages: int
    simulated_s: float  # the step-level simulation (equals time_s when blocks divide evenly)
    others: dict[str, Alternative]
    busbw_gbps: float | None
    simulation: CollectiveResult = field(repr=False)  # the timeline: every transfer's begin and end

    def to_dict(self) -> dict:
        """The numbers as JSON-ready data (the simulation's transfers left out)."""
        d = asdict(self)
        del d["simulation"]
        return d


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
    chosen = resolve(op, algo, "algo")
    alpha, beta, gamma = _parameters(preset, ranks, alpha_us, bandwidth_gbps, gamma_gbps)
    cm = CostModel.from_params(ranks, alpha, beta, gamma)
    name = chosen if chosen is not None else cm.choose(op, nbytes, ranks)
    a = REGISTRY[(op, name)]
    ca, kb, kg = a.coeffs(ranks)
    total = a.time(ranks, nbytes, alpha, beta, gamma)
    sched = make_schedule(op, name, ranks, nbytes, 0)
    _, log = run_times(sched, lambda i, j: (alpha, beta), gamma, record=True)
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
        formula=a.formula,
        description=a.description,
        coefficients=Coefficients(ca, kb, kg),
        time_s=total,
        breakdown_s=a.split(ranks, nbytes, alpha, beta, gamma),
        steps=_steps(sched, log),
        bytes_on_wire=sched.units_sent,
        messages=sched.messages,
        simulated_s=res[0].duration,
        others=others,
        busbw_gbps=busbw_gbps(op, nbytes, ranks, total),
        simulation=res[0],
    )


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


def _steps(sched: Schedule, log: list[TransferTime]) -> list[Step]:
    """The step table from the no-contention run's transfers."""
    steps = []
    prev_end = 0.0
    for k, st in enumerate(sched.steps):
        end = max(t.end for t in log if t.step == k)
        steps.append(
            Step(
                k,
                sched.phases[k],
                len(st),
                [(t.src, t.dst) for t in st][:8],
                max(t.count for t in st),
                any(t.reduce for t in st),
                end - prev_end,
                end,
            )
        )
        prev_end = end
    return steps


def crossover(a: Algorithm, b: Algorithm, p: int, alpha: float, beta: float, gamma: float) -> int | None:
    """Smallest size in [1 B, 1 TiB] where the faster of a, b changes (bisection), if any."""

    def d(n: float) -> float:
        return a.time(p, n, alpha, beta, gamma) - b.time(p, n, alpha, beta, gamma)

    lo, hi = CROSSOVER_RANGE
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
