"""Fitting cost parameters to measurements, weighted so every size counts the same.

Both kinds of fit minimise *relative* error (1 KiB counts as much as 64 MiB):

* `fit_algorithm`: alpha and beta of one algorithm's closed form
  ``T = ca*alpha + n*(kb*beta + kg*gamma)``, gamma measured on its own (a local
  reduction benchmark, `simdist.timing.experiments.measure_gamma`) because one
  all_reduce sweep cannot tell the network's bytes from the adder's.
* `fit_model`: what Gloo really does. torch's CPU all_reduce is gloo's ring
  (`simdist.collectives.gloo`) on TCP over loopback: below 2p MiB its message count is
  fixed and above it grows with n, so time is affine in n within regimes, with regime
  changes where the segment structure changes or where messages outgrow the socket and
  cache sizes. The fit is piecewise: either affine segments with jumps (breakpoints by
  dynamic programming with a BIC penalty, `fit_piecewise`) or a continuous hinge fit
  (`fit_hinge`), chosen by leave-one-out cross-validation; a breakpoint that falls
  between two fitted sizes snaps to Gloo's structural threshold when one lies there.

Every curve is *non-decreasing* in n (`fit_monotone`): moving more bytes never takes less
time, so no segment has a negative slope and a jump at a breakpoint only goes up. Segments
fitted one by one do not know that: a first segment whose slope is pulled up by its last
points, extrapolated to a breakpoint placed between two measured sizes, can end above where
the next one starts, and the curve then falls as size grows (what docs/img/compare-gloo-p2.png
showed). All fits are non-negative least squares (`scipy.optimize.nnls`) in a basis whose
coefficients are the intercept, each segment's slope and each jump.

`calibrate` bundles both for one sweep into the `OpProfile` that the cost model reads.
"""

from __future__ import annotations

import math

import numpy as np

from simdist.collectives.algorithms import REGISTRY, algorithms_for
from simdist.collectives.gloo import segment_thresholds
from simdist.network.profile import AlgoFit, OpProfile, PiecewiseFit, Segment


def fit_affine(xs: list[float], ys: list[float]) -> tuple[float, float, float]:
    """Minimise sum(((a + b*x) - y) / y)^2 with a, b >= 0. Returns (a, b, sse)."""
    x = np.asarray(xs, dtype=float)
    a, b = _nnls_relative(np.stack([np.ones_like(x), x], axis=1), np.asarray(ys, dtype=float))
    sse = sum(((a + b * xi) - y) ** 2 / (y * y) for xi, y in zip(xs, ys, strict=False))
    return a, b, sse


def _nnls_relative(basis: np.ndarray, y: np.ndarray, weight: np.ndarray | None = None) -> np.ndarray:
    """Coefficients c >= 0 minimising sum(((basis @ c) - y) * w)^2, w = 1/y unless given
    (relative error). Columns are scaled to unit norm first: sizes span 1 KiB .. 64 MiB and
    seconds are ~1e-4, so the raw columns differ by ten orders of magnitude."""
    # imported here, not with the module: the CLI imports this module for every command, and
    # scipy.optimize alone doubled `simdist`'s start-up (seconds on a busy host); fits are rare
    from scipy.optimize import nnls

    w = 1.0 / y if weight is None else weight
    a = basis * w[:, None]
    norms = np.linalg.norm(a, axis=0)
    norms[norms == 0] = 1.0

    c, _ = nnls(a / norms, y * w)
    return c / norms


def fit_monotone(xs: list[float], ys: list[float], knots: list[float], jumps: bool) -> PiecewiseFit:
    """The best non-decreasing piecewise-affine curve with breaks at `knots` (relative error):
    T(n) = a + sum_i s_i * (clip(n, k_i, k_i+1) - k_i) [+ sum_i j_i * (n >= k_i)], every
    coefficient >= 0, so each segment's slope is s_i >= 0 and each jump j_i >= 0 (``jumps``;
    without them the curve is continuous). Returned as one `Segment` per interval."""
    x = np.asarray(xs, dtype=float)
    y = np.asarray(ys, dtype=float)
    ks = sorted({float(k) for k in knots if k > 0})
    bounds = [0.0, *ks, math.inf]
    cols = [np.ones_like(x)]
    cols += [np.clip(x, lo, hi) - lo for lo, hi in zip(bounds, bounds[1:], strict=False)]
    if jumps:
        cols += [(x >= k).astype(float) for k in ks]
    c = _nnls_relative(np.stack(cols, axis=1), y)
    a0, slopes, steps = float(c[0]), [float(v) for v in c[1:len(bounds)]], [float(v) for v in c[len(bounds):]]
    segs = []
    base = a0
    for i, (lo, hi) in enumerate(zip(bounds, bounds[1:], strict=False)):
        if i > 0:
            base += slopes[i - 1] * (lo - bounds[i - 1]) + (steps[i - 1] if jumps else 0.0)
        segs.append(Segment(lo, hi, base - slopes[i] * lo, slopes[i]))
    fit = PiecewiseFit(segs)
    fit.sse = sum(((fit.predict(xi) - yi) / yi) ** 2 for xi, yi in zip(xs, ys, strict=False))
    return fit


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
    # the regimes found segment by segment, refitted together as one non-decreasing curve
    return _monotone_regimes(xs, ys, [(xs[i - 1], xs[i]) for i, _ in bounds[1:]], hints or [])


def _monotone_regimes(xs: list[float], ys: list[float], gaps: list[tuple[float, float]],
                      hints: list[float]) -> PiecewiseFit:
    """One non-decreasing curve through regimes that change in the given gaps between measured
    sizes. A gap holding a structural threshold breaks there; any other breaks at the gap's
    geometric mean, or at its right end when that fits better: where the later regime starts
    lower but rises faster, a jump up is only possible late in the gap."""
    breaks = [_breakpoint(left, right, hints) for left, right in gaps]
    best = fit_monotone(xs, ys, breaks, jumps=True)
    for i, (left, right) in enumerate(gaps):
        if any(left <= h < right for h in hints):
            continue
        trial = [*breaks[:i], right, *breaks[i + 1:]]
        f = fit_monotone(xs, ys, trial, jumps=True)
        if f.sse < best.sse * (1 - 1e-9):
            breaks, best = trial, f
    return best


def fit_hinge(xs: list[float], ys: list[float], knots: list[float]) -> PiecewiseFit:
    """Continuous non-decreasing piecewise-affine fit with breaks at `knots` (relative error)."""
    return fit_monotone(xs, ys, knots, jumps=False)


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
    the backend if one lies between them, else their geometric mean. Gloo's rule is
    "n > threshold", so a threshold h puts the break at h + 1: `left` must be <= h (old
    regime) and `right` > h (new regime), as the fit found them; a threshold equal to
    `right` would put the measured `right` back into the old regime."""
    for h in hints:
        if left <= h < right:
            return float(h) + 1
    return math.sqrt(left * right)


def fit_algorithm(op: str, algo: str, p: int, sizes: list[float], times: list[float], gamma: float) -> AlgoFit:
    """alpha, beta of one closed form (gamma given), minimising relative error."""
    ca, kb, kg = REGISTRY[(op, algo)].coeffs(p)
    # T - n*kg*gamma = ca*alpha + n*kb*beta: an affine fit in n with a = ca*alpha, b = kb*beta.
    ys = np.asarray([max(t - n * kg * gamma, 1e-12) for n, t in zip(sizes, times, strict=False)])
    x = np.asarray(sizes, dtype=float)
    # Weights stay those of the measured times (relative error of T, not of T - reduction).
    a, b = _nnls_relative(np.stack([np.ones_like(x), x], axis=1), ys, 1.0 / np.asarray(times, dtype=float))
    alpha = float(a) / ca if ca else 0.0
    beta = float(b) / kb if kb else 0.0
    sse = sum(
        ((ca * alpha + n * (kb * beta + kg * gamma)) - t) ** 2 / (t * t) for n, t in zip(sizes, times, strict=False)
    )
    return AlgoFit(algo, alpha, beta, gamma, sse)


def calibrate(
    op: str, p: int, sizes: list[float], times: list[float], gamma: float, backend: str = "gloo"
) -> OpProfile:
    """Fit the piecewise model and every algorithm's closed form to one sweep."""
    hints = segment_thresholds(p) if (backend == "gloo" and op == "all_reduce") else []
    pw, _kind = fit_model(sizes, times, hints=hints)
    algos = {a: fit_algorithm(op, a, p, sizes, times, gamma) for a in algorithms_for(op)}
    return OpProfile(op, p, pw, algos, backend)
