"""Fitting: closed-form parameters, the piecewise Gloo model, profiles, compare-timing."""

from __future__ import annotations

import json
import math
import random
import re
from pathlib import Path

import pytest
from typer.testing import CliRunner

from real_backend import bench as b
from simdist.cli.timing import app
from simdist.collectives import REGISTRY
from simdist.network import CostModel
from simdist.network.profile import Profile
from simdist.timing import experiments, fit, plots
from simdist.timing.sweeps import geometric_sizes, midpoint_sizes

MB = 1 << 20
ROOT = Path(__file__).resolve().parent.parent
runner = CliRunner()


def test_fit_affine_recovers_line():
    xs = [2.0**k for k in range(10, 27)]
    ys = [3e-4 + 2e-9 * x for x in xs]
    a, b, sse = fit.fit_affine(xs, ys)
    assert a == pytest.approx(3e-4, rel=1e-6) and b == pytest.approx(2e-9, rel=1e-6) and sse < 1e-12


def test_fit_algorithm_recovers_alpha_beta():
    p, alpha, beta, gamma = 4, 5e-5, 3e-10, 1e-10
    ring = REGISTRY[("all_reduce", "ring")]
    xs = [2.0**k for k in range(10, 27)]
    ys = [ring.time(p, x, alpha, beta, gamma) for x in xs]
    f = fit.fit_algorithm("all_reduce", "ring", p, xs, ys, gamma)
    assert f.alpha == pytest.approx(alpha, rel=1e-6) and f.beta == pytest.approx(beta, rel=1e-6)


def _gloo_like(n: float, jump: float = 3 * MB) -> float:
    """Flat ~0.45 ms, a slope, then a steeper slope after a jump (as measured here:
    bench/results/compare-gloo-p2.json). Never falling as n grows, as measured times do not;
    the fitted curves cannot fall either (fit.fit_monotone)."""
    if n < 256 * 1024:
        return 4.5e-4 + 2e-10 * n
    if n < jump:
        return 3e-4 + 8e-10 * n
    return 1.5e-3 + 5.5e-10 * n + 0.2e-9 * n


def test_piecewise_recovers_regimes_and_predicts_held_out():
    xs = [1024 * 2**k for k in range(17)]
    rng = random.Random(1)
    ys = [_gloo_like(x) * (1 + rng.uniform(-0.02, 0.02)) for x in xs]
    pw = fit.fit_piecewise(xs, ys, hints=[4 * MB])
    assert 2 <= len(pw.segments) <= 4
    held = [int(1024 * 2 ** (k + 0.5)) for k in range(16)]
    errs = [abs(pw.predict(x) - _gloo_like(x)) / _gloo_like(x) for x in held]
    assert sorted(errs)[len(errs) // 2] < 0.05
    # a regime change between two measured sizes snaps to gloo's threshold when it lies there
    assert any(abs(b - (4 * MB + 1)) < 2 for b in pw.breakpoints) or any(2 * MB < b <= 4 * MB for b in pw.breakpoints)


def test_piecewise_single_line_stays_single():
    xs = [1024 * 2**k for k in range(17)]
    pw = fit.fit_piecewise(xs, [1e-4 + 1e-9 * x for x in xs])
    assert len(pw.segments) == 1


def test_profile_round_trip_and_cost_model(tmp_path):
    xs = [1024 * 2**k for k in range(17)]
    entry = fit.calibrate("all_reduce", 2, xs, [_gloo_like(x) for x in xs], gamma=1e-10)
    prof = Profile()
    prof.add(entry)
    path = prof.save(tmp_path / "prof.json")
    back = Profile.load(path)
    assert back.predict("all_reduce", 3 * MB, 2) == pytest.approx(prof.predict("all_reduce", 3 * MB, 2))
    assert back.predict("all_reduce", MB, 8) is None
    cm = CostModel.from_params(2, 1e-5, 1e-9, 1e-10, profile=back)
    assert cm.collective_time("all_reduce", 3 * MB, [0, 1]) == pytest.approx(back.predict("all_reduce", 3 * MB, 2))
    # an explicit algorithm bypasses the profile; other ops use the closed forms
    assert cm.collective_time("all_reduce", 3 * MB, [0, 1], algo="ring") != back.predict("all_reduce", 3 * MB, 2)
    assert set(entry.algos) == {"ring", "tree", "recursive_doubling", "rabenseifner"}


def _fake_rows(sizes, f, sweep, noise, seed):
    rng = random.Random(seed)
    rows = []
    for n in sizes:
        samples = [f(n) * (1 + rng.uniform(0, noise)) for _ in range(5)]
        t = sorted(samples)[2]
        q = sorted(samples)
        rows.append(
            b.BenchRow(
                "all_reduce",
                "gloo",
                2,
                n,
                n // 4,
                10,
                5,
                t,
                q[0],
                q[-1],
                n / t / 1e9,
                n / t / 1e9,
                samples,
                sweep,
                [q[0], q[1], q[2]],
            )
        )
    return rows


def _raw_file(tmp_path, f=_gloo_like):
    train = [_fake_rows(geometric_sizes(1024, 64 * MB), f, "train0", 0.03, 1)]
    test = [_fake_rows(midpoint_sizes(1024, 64 * MB), f, "test0", 0.03, 2)]
    path = tmp_path / "raw.json"
    path.write_text(
        json.dumps(
            {
                "gamma": 1e-10,
                "raw": {
                    "train": [[r.to_dict() for r in s] for s in train],
                    "test": [[r.to_dict() for r in s] for s in test],
                },
            }
        )
    )
    return path


def test_held_out_sizes_are_not_fitted():
    assert not set(geometric_sizes(1024, 64 * MB)) & set(midpoint_sizes(1024, 64 * MB))
    assert len(midpoint_sizes(1024, 64 * MB)) >= 15


def test_compare_timing_from_saved_measurements(tmp_path):
    raw = _raw_file(tmp_path)
    plot = tmp_path / "cmp.png"
    r = runner.invoke(
        app,
        [
            "compare-timing",
            "--load",
            str(raw),
            "--json",
            "--plot",
            str(plot),
            "--save-profile",
            str(tmp_path / "p.json"),
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert {"sizes", "median_abs_error", "worst_abs_error"} <= set(d)
    assert 0 <= d["median_abs_error"] < 0.05
    assert len(d["sizes"]) >= 15 and {"nbytes", "measured_s", "simulated_s", "rel_error"} <= set(d["sizes"][0])
    assert plot.exists() and plot.stat().st_size > 10_000
    assert Profile.load(tmp_path / "p.json").predict("all_reduce", MB, 2) is not None
    # the table form names the numbers
    r = runner.invoke(app, ["compare-timing", "--load", str(raw), "--plot", str(plot)])
    assert r.exit_code == 0 and "median |error|" in r.output and "worst" in r.output


def test_compare_timing_exit_codes(tmp_path):
    raw = _raw_file(tmp_path, f=lambda n: 4e-4 * (1.5 if (int(math.log2(n) * 2) % 2) else 1.0) + 1e-9 * n)
    r = runner.invoke(
        app, ["compare-timing", "--load", str(raw), "--max-error", "0.001", "--plot", str(tmp_path / "x.png")]
    )
    assert r.exit_code == 1
    r = runner.invoke(app, ["compare-timing", "--stat", "mean"])
    assert r.exit_code == 2 and r.output.strip().splitlines() == [
        "error: stat: unknown statistic 'mean' (choose from auto, op_p10, op_p25, op_median, min, median)"
    ]
    r = runner.invoke(app, ["compare-timing", "--ranks", "1"])
    assert r.exit_code == 2 and "ranks" in r.output and "Traceback" not in r.output
    r = runner.invoke(app, ["compare-timing", "--min-bytes", "lots"])
    assert r.exit_code == 2 and "min-bytes" in r.output
    r = runner.invoke(app, ["bench", "--op", "allreduce"])
    assert r.exit_code == 2 and "op: unknown op 'allreduce'" in r.output


def test_compare_figure_content(tmp_path):
    raw = _raw_file(tmp_path)
    d = json.loads(raw.read_text())["raw"]
    train = [[b.BenchRow(**x) for x in s] for s in d["train"]]
    test = [[b.BenchRow(**x) for x in s] for s in d["test"]]
    res = experiments.evaluate(train, test, "op_p25", "all_reduce", 2, 1e-10)
    fig = plots.compare_figure(res)
    ax = fig.axes[0]
    assert ax.get_xscale() == "log" and ax.get_yscale() == "log"
    labels = [t.get_text() for t in ax.get_legend().get_texts()]
    assert any("measured (calibration" in x for x in labels) and any("held-out" in x for x in labels)
    assert any("simulated" in x for x in labels)
    closed = " | ".join(x for x in labels if "closed form" in x)
    # every all_reduce algorithm named once; curves that coincide (here all four) drawn once
    names = re.findall(r"\b(ring|tree|recursive_doubling|rabenseifner)\b", closed)
    assert sorted(names) == sorted(["ring", "tree", "recursive_doubling", "rabenseifner"])
    assert "held-out median |error|" in ax.get_title()


def test_measure_gamma_is_plausible():
    g = experiments.measure_gamma(sizes=(1 << 16, 1 << 18, 1 << 20), repeats=3)
    assert 1e-12 < g < 1e-8  # between 0.1 and 1000 GB/s


def test_real_gloo_bench_small():
    """A tiny real sweep: 2 Gloo ranks on 127.0.0.1, two sizes, every process ends."""
    rows = b.run_sweep(
        "all_reduce", 2, [1024, 65536], "gloo", warmup=2, repeats=3, target_batch_s=0.005, max_iters=20, timeout_s=60
    )
    assert [r.nbytes for r in rows] == [1024, 65536]
    for r in rows:
        assert r.time_s > 0 and r.busbw_gbps == pytest.approx(r.algbw_gbps * 1.0)  # 2(p-1)/p = 1 at p = 2
        assert len(r.samples_s) == 3 and len(r.op_quantiles_s) == 3


def test_fit_model_prefers_simple_models_on_noisy_lines():
    xs = [1024 * 2**k for k in range(17)]
    rng = random.Random(3)
    ys = [(4e-4 + 1e-9 * x) * (1 + rng.uniform(-0.05, 0.05)) for x in xs]
    _, kind = fit.fit_model(xs, ys, hints=[4 * MB])
    assert kind in ("hinge0", "hinge1")
    ys2 = [_gloo_like(x) for x in xs]
    fit2, kind2 = fit.fit_model(xs, ys2, hints=[4 * MB])
    assert kind2 != "hinge0" and fit2.sse < 1e-3


def test_choose_stat_uses_calibration_repeatability():
    sizes = geometric_sizes(1024, 1 * MB)
    rows = []
    for s in range(3):
        sweep = []
        for n in sizes:
            noisy = [1e-3 * (1 + 0.5 * ((s + i) % 3)) for i in range(3)]  # quantiles jump between sweeps
            sweep.append(
                b.BenchRow(
                    "all_reduce", "gloo", 2, n, n // 4, 10, 5, 1e-3, 1e-3, 1e-3, 1.0, 1.0, [1e-3] * 5, f"t{s}", noisy
                )
            )
        rows.append(sweep)
    assert experiments.choose_stat(rows) == "median"  # the batch median is the steady one here
    assert experiments.choose_stat(rows[:1]) == "op_p10"


def test_fitted_curves_never_fall_as_size_grows():
    """The measured p = 2 sweep of docs/img/compare-gloo-p2.png: fitting segment by segment
    put a downward jump of 0.19 ms at the 724 KiB break; every fit is now non-decreasing."""
    saved = json.loads((ROOT / "bench" / "results" / "compare-gloo-p2.json").read_text())
    pts = sorted((r["nbytes"], r["measured_s"]) for r in saved["train"])
    xs, ys = [float(x) for x, _ in pts], [y for _, y in pts]
    grid = [xs[0] * (xs[-1] / xs[0]) ** (i / 999) for i in range(1000)]
    fits = [fit.fit_model(xs, ys, hints=[4 * MB])[0], fit.fit_piecewise(xs, ys, max_segments=4, penalty=0.0),
            fit.fit_hinge(xs, ys, [xs[5], xs[9]])]
    for f in fits:
        values = [f.predict(x) for x in grid]
        assert all(b >= a - 1e-15 for a, b in zip(values, values[1:], strict=False)), f
        assert all(s.b >= 0 for s in f.segments)
