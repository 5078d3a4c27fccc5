"""Fitting cost parameters to measurements, and predicting sizes that were not fitted.

Two kinds of fit, both weighted so that they minimise *relative* error (every size
counts the same, 1 KiB as much as 64 MiB):

* ``fit_algorithm``: alpha and beta of one algorithm's closed form
  ``T = ca*alpha + n*(kb*beta + kg*gamma)``, gamma measured on its own (a local
  reduction benchmark, `measure_gamma`) because one all_reduce sweep cannot tell the
  network's bytes from the adder's.
* ``fit_piecewise``: what Gloo really does. torch's CPU all_reduce is gloo::allreduce
  with the default algorithm, the *ring* (gloo/allreduce.cc, ``ring()``), on TCP over
  loopback. The ring cuts the buffer into ``numSegments = roundUp(max(ceil(n / 1 MiB),
  2p), p)`` segments (``kMaxSegmentSize`` = 1 MiB) with two in flight, so below 2p MiB the
  message count is fixed (2 * (numSegments - numSegments/p) messages of n/(2p)) and
  above it grows with n. Time therefore is affine in n within regimes, with regime
  changes where the segment structure changes or where messages outgrow the socket
  and cache sizes. The fit is a segmented affine regression: breakpoints chosen by
  dynamic programming with a BIC penalty, a breakpoint that falls between two fitted
  sizes snapped to Gloo's structural threshold when one lies there.

A `Profile` bundles fits per (op, world size) and is what `CostModel(profile=...)` uses.
"""

from __future__ import annotations

import json
import math
import statistics
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simdist.collectives.algorithms import REGISTRY, algorithms_for

GLOO_MAX_SEGMENT = 1 << 20  # gloo::AllreduceOptionsImpl::kMaxSegmentSize


# --------------------------------------------------------------------------- gloo structure
def gloo_ring_segments(nbytes: int, p: int, elem: int = 4) -> tuple[int, int]:
    """(numSegments, segmentBytes) of gloo's ring all_reduce (gloo/allreduce.cc)."""
    max_seg = elem * max(1, GLOO_MAX_SEGMENT // elem)
    num = max(-(-nbytes // max_seg), 2 * p)
    num = -(-num // p) * p
    seg = -(-max(-(-nbytes // num), 1) // elem) * elem
    return num, seg


def gloo_ring_messages(nbytes: int, p: int) -> int:
    """Messages each rank sends in gloo's ring all_reduce: reduce-scatter + all-gather."""
    num, _ = gloo_ring_segments(nbytes, p)
    return 2 * (num - num // p)


def gloo_thresholds(p: int) -> list[int]:
    """Sizes where gloo's ring changes structure: above 2p MiB segments stop growing."""
    return [2 * p * GLOO_MAX_SEGMENT]


# --------------------------------------------------------------------------- fits
@dataclass
class Segment:
    lo: float  # applies to lo <= n < hi
    hi: float
    a: float  # seconds
    b: float  # seconds per byte

    def __call__(self, n: float) -> float:
        return self.a + self.b * n


@dataclass
class PiecewiseFit:
    segments: list[Segment]
    sse: float = 0.0

    def predict(self, n: float) -> float:
        for s in self.segments:
            if n < s.hi:
                return s(n)
        return self.segments[-1](n)

    @property
    def breakpoints(self) -> list[float]:
        return [s.lo for s in self.segments[1:]]

    def to_dict(self) -> dict:
        return {"segments": [asdict(s) for s in self.segments], "sse": self.sse}

    @classmethod
    def from_dict(cls, d: dict) -> PiecewiseFit:
        return cls([Segment(**s) for s in d["segments"]], d.get("sse", 0.0))


def fit_affine(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Minimise sum(((a + b*x) - y) / y)^2 with a, b >= 0. Returns (a, b, sse).

    Relative error is weighted least squares with weights 1/y^2 (see `_wls`)."""
    a, b = _wls(xs, ys, [1.0 / (y * y) for y in ys])
    sse = sum(((a + b * x) - y) ** 2 / (y * y) for x, y in zip(xs, ys, strict=False))
    return a, b, sse


def fit_piecewise(
    sizes: list[float],
    times: list[float],
    max_segments: int = 4,
    min_points: int = 3,
    hints: list[float] | None = None,
    penalty: float | None = None,
) -> PiecewiseFit:
    """Segmented affine fit in relative error; see the module docstring."""
    pts = sorted(zip(sizes, times, strict=False))
    xs = [float(x) for x, _ in pts]
    ys = [float(y) for _, y in pts]
    n = len(xs)
    if n == 0:
        raise ValueError("no measurements to fit")
    min_points = max(1, min(min_points, n))
    cost: dict[tuple[int, int], tuple[float, float, float]] = {}
    for i in range(n):
        for j in range(i + min_points, n + 1):
            cost[(i, j)] = fit_affine(xs[i:j], ys[i:j])
    kmax = max(1, min(max_segments, n // min_points))
    inf = float("inf")
    best = [[inf] * (n + 1) for _ in range(kmax + 1)]
    arg = [[-1] * (n + 1) for _ in range(kmax + 1)]
    best[0][0] = 0.0
    for k in range(1, kmax + 1):
        for j in range(n + 1):
            for i in range(j):
                c = cost.get((i, j))
                if c is None or best[k - 1][i] == inf:
                    continue
                v = best[k - 1][i] + c[2]
                if v < best[k][j]:
                    best[k][j] = v
                    arg[k][j] = i
    # BIC-like choice of the number of segments (3 parameters per segment).
    pen = math.log(max(n, 2)) * 3 if penalty is None else penalty
    floor = (0.01**2) * n  # measurements are not better than ~1%: do not chase noise
    scores = []
    for k in range(1, kmax + 1):
        if best[k][n] < inf:
            scores.append((n * math.log(max(best[k][n], floor) / n) + pen * k, k))
    _, k = min(scores)
    bounds = []
    j = n
    for kk in range(k, 0, -1):
        i = arg[kk][j]
        bounds.append((i, j))
        j = i
    bounds.reverse()
    segs = []
    for idx, (i, j) in enumerate(bounds):
        a, b, _ = cost[(i, j)]
        lo = 0.0 if idx == 0 else _breakpoint(xs[i - 1], xs[i], hints or [])
        segs.append(Segment(lo, inf, a, b))
    for s, nxt in zip(segs, segs[1:], strict=False):
        s.hi = nxt.lo
    return PiecewiseFit(segs, best[k][n])


def fit_hinge(xs: list[float], ys: list[float], knots: list[float]) -> PiecewiseFit:
    """Continuous piecewise-linear fit T = a + b*n + sum_k c_k*max(0, n - knot_k), weighted
    for relative error, returned as segments (one per interval between knots)."""
    import numpy as np

    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    ks = sorted(set(float(k) for k in knots))
    cols = [np.ones_like(x), x] + [np.maximum(0.0, x - k) for k in ks]
    A = np.stack(cols, axis=1) / y[:, None]
    coef, *_ = np.linalg.lstsq(A, np.ones_like(y), rcond=None)
    a, b, cs = float(coef[0]), float(coef[1]), [float(c) for c in coef[2:]]
    segs = []
    bounds = [0.0, *ks, float("inf")]
    for i in range(len(bounds) - 1):
        # on [bounds[i], bounds[i+1]): active hinges are knots <= bounds[i]
        sa, sb = a, b
        for k, c in zip(ks[:i], cs[:i], strict=False):
            sa -= c * k
            sb += c
        segs.append(Segment(bounds[i], bounds[i + 1], sa, sb))
    fit = PiecewiseFit(segs)
    fit.sse = sum(((fit.predict(xi) - yi) / yi) ** 2 for xi, yi in zip(xs, ys, strict=False))
    return fit


def _greedy_hinge(xs: list[float], ys: list[float], n_knots: int, cands: list[float]) -> PiecewiseFit:
    knots: list[float] = []
    best = fit_hinge(xs, ys, knots)
    for _ in range(n_knots):
        trial = None
        for c in cands:
            if c in knots:
                continue
            f = fit_hinge(xs, ys, knots + [c])
            if trial is None or f.sse < trial[1].sse:
                trial = (c, f)
        if trial is None:
            break
        knots.append(trial[0])
        best = trial[1]
    return best


def _loo_error(xs: list[float], ys: list[float], fitter) -> float:
    """Leave-one-out mean |relative error| of a fitting procedure (interior points only:
    extrapolating past the ends is not what held-out sizes ask for)."""
    errs = []
    for i in range(1, len(xs) - 1):
        f = fitter(xs[:i] + xs[i + 1 :], ys[:i] + ys[i + 1 :])
        errs.append(abs(f.predict(xs[i]) - ys[i]) / ys[i])
    return sum(errs) / len(errs) if errs else 0.0


def fit_model(sizes: list[float], times: list[float], hints: list[float] | None = None) -> tuple[PiecewiseFit, str]:
    """Choose between segmented (jumps allowed) and continuous hinge fits of 0-3 knots by
    leave-one-out cross-validation on the calibration sweep alone: the simplest model whose
    LOO error is within 10% of the best one."""
    pts = sorted(zip(sizes, times, strict=False))
    xs = [float(x) for x, _ in pts]
    ys = [float(y) for _, y in pts]
    hints = list(hints or [])
    cands = sorted(set(xs[1:-1]) | {float(h) for h in hints if xs[0] < h < xs[-1]})
    options = {}
    # simplest first (parameter count): hinges have 2 + k, segments 3k - 1
    for k in range(0, 3):
        options[f"hinge{k}"] = lambda X, Y, k=k: _greedy_hinge(X, Y, k, [c for c in cands if X[0] < c < X[-1]])
    options["segments2"] = lambda X, Y: fit_piecewise(X, Y, max_segments=2, hints=hints, penalty=0.0)
    options["hinge3"] = lambda X, Y: _greedy_hinge(X, Y, 3, [c for c in cands if X[0] < c < X[-1]])
    for k in (3, 4):
        options[f"segments{k}"] = lambda X, Y, k=k: fit_piecewise(X, Y, max_segments=k, hints=hints, penalty=0.0)
    if len(xs) < 6:
        return options["hinge0"](xs, ys), "hinge0"
    scores = {name: _loo_error(xs, ys, f) for name, f in options.items()}
    # The simplest model within 10% of the best cross-validated error: noise must not buy knots.
    best = min(scores.values())
    name = next(k for k in options if scores[k] <= 1.1 * best + 1e-12)
    return options[name](xs, ys), name


def _breakpoint(left: float, right: float, hints: list[float]) -> float:
    """Where a regime change between two measured sizes goes: a structural threshold of
    the backend if one lies between them, else their geometric mean."""
    for h in hints:
        if left < h <= right:
            return float(h) + 1  # gloo's rule is "n > threshold"
    return math.sqrt(left * right)


@dataclass
class AlgoFit:
    algo: str
    alpha: float
    beta: float
    gamma: float
    sse: float

    def predict(self, op: str, nbytes: float, p: int) -> float:
        return REGISTRY[(op, self.algo)].time(p, nbytes, self.alpha, self.beta, self.gamma)


def fit_algorithm(op: str, algo: str, p: int, sizes: list[float], times: list[float], gamma: float) -> AlgoFit:
    """alpha, beta of one closed form (gamma given), minimising relative error."""
    ca, kb, kg = REGISTRY[(op, algo)].coeffs(p)
    # T - n*kg*gamma = ca*alpha + n*kb*beta: an affine fit in n with a = ca*alpha, b = kb*beta.
    ys = [max(t - n * kg * gamma, 1e-12) for n, t in zip(sizes, times, strict=False)]
    # Weights stay those of the measured times (relative error of T, not of T - reduction).
    w = [1.0 / (t * t) for t in times]
    a, b = _wls(list(sizes), ys, w)
    alpha = a / ca if ca else 0.0
    beta = b / kb if kb else 0.0
    sse = sum(
        ((ca * alpha + n * (kb * beta + kg * gamma)) - t) ** 2 / (t * t) for n, t in zip(sizes, times, strict=False)
    )
    return AlgoFit(algo, alpha, beta, gamma, sse)


def _wls(xs: list[float], ys: list[float], w: list[float]) -> tuple[float, float]:
    sw = sum(w)
    sx = sum(wi * x for wi, x in zip(w, xs, strict=False))
    sy = sum(wi * y for wi, y in zip(w, ys, strict=False))
    sxx = sum(wi * x * x for wi, x in zip(w, xs, strict=False))
    sxy = sum(wi * x * y for wi, x, y in zip(w, xs, ys, strict=False))
    det = sw * sxx - sx * sx
    if det > 0:
        b = (sw * sxy - sx * sy) / det
        a = (sy - b * sx) / sw
        if a >= 0 and b >= 0:
            return a, b
    # clamp one parameter at zero and refit the other
    opts = [(sy / sw, 0.0)]
    if sxx > 0:
        opts.append((0.0, max(sxy / sxx, 0.0)))
    return min(opts, key=lambda ab: sum(wi * (ab[0] + ab[1] * x - y) ** 2 for wi, x, y in zip(w, xs, ys, strict=False)))


# --------------------------------------------------------------------------- gamma
def measure_gamma(sizes: tuple[int, ...] = (1 << 16, 1 << 18, 1 << 20, 1 << 22, 1 << 24), repeats: int = 5) -> float:
    """Seconds per byte of a float32 sum on one CPU thread (torch add_), the reduction a
    Gloo rank performs on every received byte of a reducing step."""
    import torch

    old = torch.get_num_threads()
    torch.set_num_threads(1)
    try:
        xs, ys = [], []
        for nb in sizes:
            a = torch.zeros(nb // 4)
            b = torch.ones(nb // 4)
            a.add_(b)
            best = float("inf")
            for _ in range(repeats):
                t0 = time.perf_counter()
                a.add_(b)
                best = min(best, time.perf_counter() - t0)
            xs.append(nb)
            ys.append(best)
        _, slope, _ = fit_affine(xs, ys)
        return slope
    finally:
        torch.set_num_threads(old)


# --------------------------------------------------------------------------- profiles
@dataclass
class OpProfile:
    op: str
    world_size: int
    piecewise: PiecewiseFit
    algos: dict[str, AlgoFit] = field(default_factory=dict)
    backend: str = "gloo"

    def to_dict(self) -> dict:
        return {
            "op": self.op,
            "world_size": self.world_size,
            "backend": self.backend,
            "piecewise": self.piecewise.to_dict(),
            "algos": {k: asdict(v) for k, v in self.algos.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> OpProfile:
        return cls(
            d["op"],
            int(d["world_size"]),
            PiecewiseFit.from_dict(d["piecewise"]),
            {k: AlgoFit(**v) for k, v in d.get("algos", {}).items()},
            d.get("backend", "gloo"),
        )


@dataclass
class Profile:
    """Calibrated timing per (op, world size); `predict` returns None where not calibrated."""

    entries: dict[tuple[str, int], OpProfile] = field(default_factory=dict)

    def add(self, e: OpProfile) -> None:
        self.entries[(e.op, e.world_size)] = e

    def predict(self, op: str, nbytes: float, p: int) -> float | None:
        e = self.entries.get((op, p))
        if e is None:
            return None
        return e.piecewise.predict(nbytes)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"entries": [e.to_dict() for e in self.entries.values()]}, indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        d = json.loads(Path(path).read_text())
        prof = cls()
        for e in d["entries"]:
            prof.add(OpProfile.from_dict(e))
        return prof


def calibrate(
    op: str, p: int, sizes: list[float], times: list[float], gamma: float, backend: str = "gloo"
) -> OpProfile:
    """Fit the piecewise model and every algorithm's closed form to one sweep."""
    hints = gloo_thresholds(p) if (backend == "gloo" and op == "all_reduce") else []
    pw, _kind = fit_model(sizes, times, hints=hints)
    algos = {a: fit_algorithm(op, a, p, sizes, times, gamma) for a in algorithms_for(op)}
    return OpProfile(op, p, pw, algos, backend)


# --------------------------------------------------------------------------- errors
def rel_errors(measured: list[float], predicted: list[float]) -> list[float]:
    return [(s - m) / m for m, s in zip(measured, predicted, strict=False)]


def summarize(errors: list[float]) -> dict[str, float]:
    ab = [abs(e) for e in errors]
    if not ab:
        return {"median_abs_error": float("nan"), "worst_abs_error": float("nan"), "mean_abs_error": float("nan")}
    return {
        "median_abs_error": statistics.median(ab),
        "worst_abs_error": max(ab),
        "mean_abs_error": sum(ab) / len(ab),
    }


# --------------------------------------------------------------------------- measurement driver
# Statistics of one size in one sweep: over batch means (min, median) or over single
# operations of the slowest rank (op_p10, op_p25, op_median). Single-op low quantiles are
# the most repeatable on a shared 2-core machine: interference from other processes
# lengthens some operations, not all.
STATS = ("op_p10", "op_p25", "op_median", "min", "median")
STAT_CHOICES = ("auto", *STATS)
# "auto" picks among quantile statistics only: the minimum of a handful of batch means is
# an extreme value whose level depends on how many batches were taken.
AUTO_STATS = ("op_p10", "op_p25", "op_median", "median")


def choose_stat(train_rows: list[list]) -> str:
    """The statistic that repeats best between the *calibration* sweeps (median over sizes
    of the coefficient of variation across sweeps). Held-out sweeps play no part. With
    two ranks on two cores a low quantile of single operations usually wins; with four
    ranks oversubscribing two cores single operations are bimodal and the choice varies."""
    if len(train_rows) < 2:
        return STATS[0]
    best = None
    for st in AUTO_STATS:
        per: dict[int, list[float]] = {}
        for rows in train_rows:
            for r in rows:
                per.setdefault(r.nbytes, []).append(row_stat(r, st))
        cvs = [statistics.pstdev(v) / statistics.mean(v) for v in per.values() if len(v) > 1 and statistics.mean(v) > 0]
        if not cvs:
            continue
        score = statistics.median(cvs)
        if best is None or score < best[0]:
            best = (score, st)
    return best[1] if best else STATS[0]


def _bench():
    """real_backend.bench, also when simdist is installed without the repo on sys.path."""
    try:
        from real_backend import bench  # type: ignore[import-not-found]

        return bench
    except ImportError:
        import importlib.util

        path = Path(__file__).resolve().parent.parent / "real_backend" / "bench.py"
        spec = importlib.util.spec_from_file_location("real_backend_bench", path)
        if spec is None or spec.loader is None:  # pragma: no cover
            raise
        mod = importlib.util.module_from_spec(spec)
        spec.loader.exec_module(mod)
        return mod


def row_stat(row, stat: str) -> float:
    """One number per measured size from a bench row's batch samples."""
    if stat.startswith("op_") and getattr(row, "op_quantiles_s", None):
        q = row.op_quantiles_s
        return {"op_p10": q[0], "op_p25": q[1], "op_median": q[2]}[stat]
    xs = sorted(row.samples_s) if row.samples_s else [row.time_s]
    if stat == "min":
        return xs[0]
    return statistics.median(xs)


def combine_sweeps(sweeps: list[list], stat: str) -> dict[int, float]:
    """size -> median over sweeps of the per-sweep statistic."""
    per: dict[int, list[float]] = {}
    for rows in sweeps:
        for r in rows:
            per.setdefault(r.nbytes, []).append(row_stat(r, stat))
    return {n: statistics.median(v) for n, v in sorted(per.items())}


def run_compare(
    backend: str = "gloo",
    ranks: int = 2,
    op: str = "all_reduce",
    min_bytes: int = 1024,
    max_bytes: int = 64 << 20,
    sweeps: int = 3,
    repeats: int = 11,
    stat: str = "auto",
    seed: int = 0,
    train_rows: list[list] | None = None,
    test_rows: list[list] | None = None,
    gamma: float | None = None,
    progress=None,
) -> dict:
    """Measure (or reuse) a training sweep of powers of two and a separate held-out sweep
    of in-between sizes, calibrate on the first, predict the second.

    Sweeps alternate (train, held-out, train, held-out, ...) so slow drift of a shared
    machine hits both alike; each size's value is the median over sweeps of the per-sweep
    statistic `stat` of its timed batches.
    """
    if stat not in STAT_CHOICES:
        raise ValueError(f"stat: unknown statistic {stat!r} (choose from {', '.join(STAT_CHOICES)})")
    b = _bench()
    train_sizes = b.pow2_sizes(min_bytes, max_bytes)
    test_sizes = b.midpoint_sizes(min_bytes, max_bytes)
    t_start = time.time()
    if train_rows is None or test_rows is None:
        train_rows, test_rows = [], []
        total = sweeps * (len(train_sizes) + len(test_sizes))
        done = [0]

        def tick(_i, _n, row):
            done[0] += 1
            if progress is not None:
                progress(done[0], total, row)

        for s in range(sweeps):
            train_rows.append(
                b.run_sweep(
                    op,
                    ranks,
                    train_sizes,
                    backend,
                    repeats=repeats,
                    seed=seed + 2 * s,
                    sweep=f"train{s}",
                    progress=tick,
                )
            )
            test_rows.append(
                b.run_sweep(
                    op,
                    ranks,
                    test_sizes,
                    backend,
                    repeats=repeats,
                    seed=seed + 2 * s + 1,
                    sweep=f"test{s}",
                    progress=tick,
                )
            )
    if gamma is None:
        gamma = measure_gamma() if backend == "gloo" else 1 / 500e9
    stat_asked = stat
    if stat == "auto":
        stat = choose_stat(train_rows)
    res = evaluate(train_rows, test_rows, stat, op, ranks, gamma, backend)
    res["other_stats"] = {
        st: {
            k: v
            for k, v in evaluate(train_rows, test_rows, st, op, ranks, gamma, backend).items()
            if k.endswith("abs_error")
        }
        for st in STATS
        if st != stat
    }
    res.update(
        {
            "stat_asked": stat_asked,
            "elapsed_s": time.time() - t_start,
            "raw": {
                "train": [[r.to_dict() for r in rows_] for rows_ in train_rows],
                "test": [[r.to_dict() for r in rows_] for rows_ in test_rows],
            },
        }
    )
    return res


def evaluate(
    train_rows: list[list], test_rows: list[list], stat: str, op: str, ranks: int, gamma: float, backend: str = "gloo"
) -> dict:
    """Calibrate on the training sweeps, predict the held-out ones (see run_compare)."""
    from simdist.network.cost import CostModel

    train = combine_sweeps(train_rows, stat)
    test = combine_sweeps(test_rows, stat)
    prof_entry = calibrate(op, ranks, list(train), list(train.values()), gamma, backend)
    profile = Profile()
    profile.add(prof_entry)
    cm = CostModel.from_params(ranks, 0.0, 0.0, gamma, profile=profile)
    rows = []
    for n, m in test.items():
        sim = cm.collective_time(op, n, list(range(ranks)))
        rows.append(
            {
                "nbytes": n,
                "measured_s": m,
                "simulated_s": sim,
                "rel_error": (sim - m) / m,
                "algos": {a: f.predict(op, n, ranks) for a, f in prof_entry.algos.items()},
            }
        )
    summ = summarize([r["rel_error"] for r in rows])
    algo_err = {
        a: summarize(rel_errors([r["measured_s"] for r in rows], [r["algos"][a] for r in rows]))["median_abs_error"]
        for a in prof_entry.algos
    }
    fit_rows = [{"nbytes": n, "measured_s": t, "fitted_s": prof_entry.piecewise.predict(n)} for n, t in train.items()]
    return {
        "backend": backend,
        "ranks": ranks,
        "op": op,
        "stat": stat,
        "sweeps": len(train_rows),
        "sizes": rows,
        "train": fit_rows,
        **summ,
        "algo_median_abs_error": algo_err,
        "gamma": gamma,
        "profile": prof_entry.to_dict(),
        "gloo": {
            "algorithm": "ring (gloo::allreduce default; torch ProcessGroupGloo AsyncAllreduceWork)",
            "segment_threshold_bytes": gloo_thresholds(ranks),
            "breakpoints_bytes": [int(x) for x in prof_entry.piecewise.breakpoints],
        },
    }


# --------------------------------------------------------------------------- plots
def plot_compare(result: dict, path: str | Path) -> Path:
    """Log-log plot: measured (fitted and held-out sizes) vs simulated, per algorithm."""
    import matplotlib.pyplot as plt

    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fig = compare_figure(result)
    fig.savefig(path, dpi=110)
    plt.close(fig)
    return path


def compare_figure(result: dict):
    """The matplotlib Figure behind `plot_compare` (tests inspect it)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    op, p = result["op"], result["ranks"]
    prof = OpProfile.from_dict(result["profile"])
    xs_all = sorted([r["nbytes"] for r in result["train"]] + [r["nbytes"] for r in result["sizes"]])
    lo, hi = xs_all[0], xs_all[-1]
    grid = [lo * (hi / lo) ** (i / 199) for i in range(200)] if hi > lo else [lo]
    fig, ax = plt.subplots(figsize=(8, 5.5))
    ax.plot(
        [r["nbytes"] for r in result["train"]],
        [r["measured_s"] * 1e3 for r in result["train"]],
        "ko",
        ms=5,
        label="measured (calibration sweep)",
    )
    ax.plot(
        [r["nbytes"] for r in result["sizes"]],
        [r["measured_s"] * 1e3 for r in result["sizes"]],
        "rs",
        ms=6,
        mfc="none",
        label="measured (held-out sweep)",
    )
    ax.plot(
        grid,
        [prof.piecewise.predict(x) * 1e3 for x in grid],
        "-",
        color="tab:red",
        lw=2,
        label=f"simulated: {result['backend']} ring, piecewise fit",
    )
    styles = ["--", "-.", ":", (0, (5, 1))]
    for (name, f), ls in zip(prof.algos.items(), styles * 3, strict=False):
        ax.plot(
            grid,
            [f.predict(op, x, p) * 1e3 for x in grid],
            linestyle=ls,
            lw=1.2,
            label=f"closed form: {name} (fitted α, β)",
        )
    for b in prof.piecewise.breakpoints:
        ax.axvline(b, color="grey", lw=0.6, alpha=0.6)
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per rank")
    ax.set_ylabel("time per operation (ms)")
    med = result["median_abs_error"]
    ax.set_title(f"{op} on {result['backend']}, {p} ranks: held-out median |error| {med * 100:.1f}%")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    return fig
