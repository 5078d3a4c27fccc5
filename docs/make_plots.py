"""Regenerate the model plots of docs/cost-model.md: python docs/make_plots.py

(The measured-vs-simulated plot docs/img/compare-gloo-p2.png comes from
`python bench/timing_accuracy.py` or `simdist compare-timing --plot ...`.)
"""

from __future__ import annotations

import sys
from pathlib import Path

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from simdist.collectives import REGISTRY, algorithms_for  # noqa: E402

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
    fig, ax = plt.subplots(figsize=(7.5, 5))
    xs = sizes()
    ring = REGISTRY[("all_reduce", "ring")]
    for p in (2, 4, 8, 64):
        t = [ring.time(p, x, ALPHA, BETA, 0.0) for x in xs]
        ax.plot(xs, [x / ti / 1e9 for x, ti in zip(xs, t, strict=False)], "--", label=f"algbw, p = {p}")
        ax.plot(
            xs, [x / ti / 1e9 * 2 * (p - 1) / p for x, ti in zip(xs, t, strict=False)], "-", label=f"busbw, p = {p}"
        )
    ax.axhline(1 / BETA / 1e9, color="k", lw=0.8)
    ax.text(xs[0], 1 / BETA / 1e9 * 1.05, "link bandwidth 1/β", fontsize=8)
    ax.set_xscale("log", base=2)
    ax.set_xlabel("bytes per rank (n)")
    ax.set_ylabel("GB/s")
    ax.set_title("ring all_reduce (γ = 0): busbw = algbw · 2(p-1)/p tends to 1/β for every p")
    ax.grid(True, which="both", alpha=0.3)
    ax.legend(fontsize=8, ncol=2)
    fig.tight_layout()
    fig.savefig(IMG / "ring-busbw.png", dpi=100)
    plt.close(fig)


if __name__ == "__main__":
    IMG.mkdir(exist_ok=True)
    algorithms_plot()
    busbw_plot()
    print("wrote", sorted(p.name for p in IMG.glob("*.png")))
