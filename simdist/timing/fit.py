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

`calibrate` bundles both for one sweep into the `OpProfile` that the cost model reads.
"""

from __future__ import annotations

import math

import numpy as np

from simdist.collectives.algorithms import REGISTRY, algorithms_for
from simdist.collectives.gloo import segment_thresholds
from simdist.network.profile import AlgoFit, OpProfile, PiecewiseFit, Segment


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


def calibrate(
    op: str, p: int, sizes: list[float], times: list[float], gamma: float, backend: str = "gloo"
) -> OpProfile:
    """Fit the piecewise model and every algorithm's closed form to one sweep."""
    hints = segment_thresholds(p) if (backend == "gloo" and op == "all_reduce") else []
    pw, _kind = fit_model(sizes, times, hints=hints)
    algos = {a: fit_algorithm(op, a, p, sizes, times, gamma) for a in algorithms_for(op)}
    return OpProfile(op, p, pw, algos, backend)
