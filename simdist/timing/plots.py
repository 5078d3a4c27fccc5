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
    for names, curve, ls in zip(*_distinct_curves(prof, op, p, grid), styles * 3, strict=False):
        same = f" (the same curve at p = {p})" if len(names) > 1 else ""
        ax.plot(grid, [t * 1e3 for t in curve], linestyle=ls, lw=1.2,
                label=f"closed form{'s' if len(names) > 1 else ''}: {', '.join(names)} (fitted α, β){same}")
    for i, b in enumerate(prof.piecewise.breakpoints):
        ax.axvline(b, color="grey", lw=0.6, alpha=0.6, label="regime break of the piecewise fit" if i == 0 else None)
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


def _distinct_curves(prof: OpProfile, op: str, p: int, grid: list[float]) -> tuple[list[list[str]], list[list[float]]]:
    """The fitted closed forms, those that predict the same times drawn once (at p = 2 every
    all_reduce algorithm is one affine function of n: four lines would hide each other)."""
    names: list[list[str]] = []
    curves: list[list[float]] = []
    for name, f in prof.algos.items():
        ys = [f.predict(op, x, p) for x in grid]
        for k, other in enumerate(curves):
            if all(abs(a - b) <= 1e-9 * max(abs(a), abs(b)) for a, b in zip(ys, other, strict=True)):
                names[k].append(name)
                break
        else:
            names.append([name])
            curves.append(ys)
    return names, curves
