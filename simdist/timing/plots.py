"""The measured-vs-simulated plot of a `compare-timing` result (see `experiments.run_compare`)."""

from __future__ import annotations

from pathlib import Path

from simdist.network.profile import OpProfile


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
