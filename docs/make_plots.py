"""Regenerate every plot in docs/img: python docs/make_plots.py

The model plots are computed here; the measured-vs-simulated plots (compare-gloo-p2/p4)
refit the measurements saved in bench/results/compare-gloo-p*.json with the current fitting
code (`simdist compare-timing --load FILE --plot ...` does the same for one file; new
measurements come from `python bench/timing_accuracy.py`). The predicted-from-primitives plots
(gloo-predicted, iterations-predicted) read the run of record (`RECORD`, docs/timing.md
"Results") and timing_iterations.json (`python bench/timing_predict.py` measures them) and predict with the
calibration saved in each.
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

ROOT = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(ROOT))
from real_backend.bench import BenchRow  # noqa: E402  (the rows a sweep saves; no torch import)
from simdist.collectives import REGISTRY, algorithms_for  # noqa: E402
from simdist.timing import experiments, plots  # noqa: E402
from simdist.timing.sweeps import bus_factor  # noqa: E402

RESULTS = ROOT / "bench" / "results"
# the quiet run the predicted-from-primitives plot shows (docs/timing.md, "Runs of record")
RECORD = "timing_predict_2026-11-24e.json"

IMG = Path(__file__).resolve().parent / "img"
ALPHA, BETA, GAMMA = 30e-6, 1 / 3e9, 1 / 2.5e9  # the loopback preset


def sizes():
    return [2.0**k for k in range(6, 31)]


def algorithms_plot():
    fig, ax = plt.subplots(figsize=(7.5, 5))
    p = 8
    xs = sizes()
    ax.plot(xs, [ALPHA + x * BETA for x in xs], "k:", lw=1.5, label="seed model: T = α + n/B (one message)")
    for a in algorithms_for("all_reduce"):
        A = REGISTRY[("all_reduce", a)]
        ax.plot(xs, [A.time(p, x, ALPHA, BETA, GAMMA) for x in xs], lw=2, label=f"all_reduce {a}")
    ax.set_xscale("log", base=2)
    ax.set_yscale("log")
    ax.set_xlabel("bytes per rank (n)")
    ax.set_ylabel("seconds")
    ax.set_title("all_reduce on 8 ranks, α = 30 us, 1/β = 3 GB/s, 1/γ = 2.5 GB/s")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(IMG / "allreduce-algorithms.png", dpi=100)
    plt.close(fig)


def busbw_plot():
    """algbw (left) and busbw (right) of a ring all_reduce, one colour per p: busbw = algbw ·
    2(p-1)/p reaches the link bandwidth for every p, algbw does not. Two panels, because at
    p = 2 the factor is 1 and the two curves would lie on top of each other."""
    fig, (left, right) = plt.subplots(1, 2, figsize=(11, 4.6), sharey=True)
    xs = sizes()
    ring = REGISTRY[("all_reduce", "ring")]
    link = 1 / BETA / 1e9
    for p, colour in zip((2, 4, 8, 64), ("tab:blue", "tab:orange", "tab:green", "tab:red"), strict=True):
        algbw = [x / ring.time(p, x, ALPHA, BETA, 0.0) / 1e9 for x in xs]
        left.plot(xs, algbw, color=colour, lw=2, label=f"p = {p}")
        right.plot(xs, [a * bus_factor("all_reduce", p) for a in algbw], color=colour, lw=2,
                   label=f"p = {p} (factor {bus_factor('all_reduce', p):.3g})")
    for ax, title in ((left, "algbw = n / t"), (right, "busbw = algbw · 2(p-1)/p")):
        ax.axhline(link, color="k", lw=1, ls="--", label=f"link bandwidth 1/β = {link:g} GB/s")
        ax.set_xscale("log", base=2)
        ax.set_xlabel("bytes per rank (n)")
        ax.set_title(title)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend(fontsize=8, loc="upper left")
    left.set_ylabel("GB/s")
    left.set_ylim(0, link * 1.25)
    fig.suptitle("ring all_reduce, α = 30 us, 1/β = 3 GB/s, γ = 0: busbw tends to 1/β for every p")
    fig.tight_layout()
    fig.savefig(IMG / "ring-busbw.png", dpi=100)
    plt.close(fig)


def compare_plots():
    """Measured vs simulated Gloo all_reduce, refitted from the saved sweeps."""
    for path in sorted((ROOT / "bench" / "results").glob("compare-gloo-p*.json")):
        saved = json.loads(path.read_text())
        train = [[BenchRow(**r) for r in sweep] for sweep in saved["raw"]["train"]]
        test = [[BenchRow(**r) for r in sweep] for sweep in saved["raw"]["test"]]
        res = experiments.run_compare(saved["backend"], saved["ranks"], saved["op"], stat=saved.get("stat_asked", "auto"),
                                      train_rows=train, test_rows=test, gamma=saved.get("gamma"))
        plots.plot_compare(res, IMG / path.with_suffix(".png").name)
        print(f"{path.name}: held-out median |error| {res['median_abs_error'] * 100:.1f}%, "
              f"worst {res['worst_abs_error'] * 100:.1f}%, breakpoints {res['gloo']['breakpoints_bytes']}")


def predicted_plot():
    """Measured vs predicted per op (one panel each), world sizes 2-4: the measured value per
    size as bench/timing_predict.py judges it (25th percentile of single calls, slowest rank,
    the less disturbed of the passes), the curve from the saved calibration alone."""
    from types import SimpleNamespace

    from simdist.network.gloo_time import gloo_op_time
    from simdist.network.host import HostProfile
    from simdist.timing.experiments import row_stat

    doc = json.loads((RESULTS / RECORD).read_text())
    host = HostProfile.from_dict(doc["host"])
    ops = list(dict.fromkeys(k.split("/")[0] for k in doc["sweeps"]))
    fig, axes = plt.subplots(1, len(ops), figsize=(4 * len(ops), 4.2), sharey=True)
    xs = [2.0**k for k in range(10, 27)]
    for ax, op in zip(axes, ops, strict=True):
        for p, colour in ((2, "tab:blue"), (3, "tab:orange"), (4, "tab:green")):
            passes = doc["sweeps"].get(f"{op}/{p}")
            if not passes:
                continue
            rows = [SimpleNamespace(**r) for sweep in passes for r in sweep]
            sizes_ = sorted({r.nbytes for r in rows})
            best = [min(row_stat(r, "op_p25") for r in rows if r.nbytes == n) for n in sizes_]
            ax.plot(sizes_, best, "o", color=colour, ms=4, label=f"measured, p = {p}")
            ax.plot(xs, [gloo_op_time(host, op, int(x), p) for x in xs], "-", color=colour, lw=1.5,
                    label=f"predicted, p = {p}")
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_title(op)
        ax.set_xlabel("bytes per rank")
        ax.grid(True, which="both", alpha=0.3)
    axes[0].set_ylabel("seconds per call")
    axes[0].legend(fontsize=7)
    fig.suptitle("Gloo on 2 shared cores: measured vs predicted from calibrated primitives (nothing fitted per op)")
    fig.tight_layout()
    fig.savefig(IMG / "gloo-predicted.png", dpi=90)
    plt.close(fig)


def iterations_plot():
    """Each (iteration, rank) of the iteration scenarios: measured against simulated."""
    from simdist.network.cost import CostModel
    from simdist.network.host import HostProfile
    from simdist.network.profile import Profile
    from simdist.report import Report
    from simdist.scenario import parse_scenario
    from simdist.sim import simulate
    from simdist.timing.iterations import compare_iterations

    doc = json.loads((RESULTS / "timing_iterations.json").read_text())
    prof = Profile(host=HostProfile.from_dict(doc["host"]))
    fig, ax = plt.subplots(figsize=(6.5, 6))
    top = 0.0
    for name, entry in doc["iterations"].items():
        s = parse_scenario(entry["scenario"], name)
        sim = simulate(s, CostModel.from_scenario_topology(s.topology, s.world_size, profile=prof))
        rows = compare_iterations(sim, [Report.from_dict(r) for r in entry["runs"]])
        ax.plot([x.simulated_s * 1e3 for x in rows], [x.measured_s * 1e3 for x in rows], "o", ms=5,
                label=name.removeprefix("iter_"))
        top = max(top, *(x.measured_s * 1e3 for x in rows), *(x.simulated_s * 1e3 for x in rows))
    ax.plot([0, top], [0, top], "k-", lw=1, label="measured = simulated")
    ax.plot([0, top], [0, top * 1.15], "k:", lw=1, label="±15%")
    ax.plot([0, top], [0, top * 0.85], "k:", lw=1)
    ax.set_xlabel("simulated ms (calibrated Gloo model)")
    ax.set_ylabel("measured ms (25th percentile of the real runs)")
    ax.set_title("per iteration and rank (join_exit: a rank's shadow iterations)")
    ax.grid(True, alpha=0.3)
    ax.legend(fontsize=8)
    fig.tight_layout()
    fig.savefig(IMG / "iterations-predicted.png", dpi=90)
    plt.close(fig)


if __name__ == "__main__":
    IMG.mkdir(exist_ok=True)
    algorithms_plot()
    busbw_plot()
    compare_plots()
    predicted_plot()
    iterations_plot()
    print("wrote", sorted(p.name for p in IMG.glob("*.png")))
