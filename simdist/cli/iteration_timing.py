"""`simdist compare SCENARIO --timing`: each iteration's time per rank, simulated with the
calibrated Gloo model against the real backend's wall clock (`simdist.timing.iterations`)."""

from __future__ import annotations

import sys
from collections.abc import Callable
from pathlib import Path

from simdist.cli.console import bad_input, exit_on, fail_input, say, show, table
from simdist.errors import InputError
from simdist.jsonout import finite, write_json
from simdist.report import Report
from simdist.scenario import Scenario
from simdist.timing.iterations import QUANTILE, IterationRow, compare_iterations, median_abs_error, timing_profile

TARGET = 0.15  # issue 13: iterations predicted within 15% median


def simulate_timed(s: Scenario, profile_path: Path | None) -> Report:
    """The scenario simulated with the calibrated Gloo model (a bad scenario, profile or a
    loop that computes nothing: one line, exit 2)."""
    from simdist.network.cost import CostModel
    from simdist.sim import simulate

    with bad_input():
        prof = timing_profile(s, profile_path)
        return simulate(s, CostModel.from_scenario_topology(s.topology, s.world_size, profile=prof))


def compare_timing(s: Scenario, profile_path: Path | None, runs: int, run_real: Callable[[], Report], json_: bool,
                   max_error: float) -> None:
    """Simulate once, `run_real()` `runs` times, print the per-iteration table; exit 0 when
    the median |error| is within `max_error`, 1 otherwise or when a real run failed."""
    if runs < 1:
        with bad_input():
            raise InputError(f"runs: must be >= 1, got {runs}")
    if not 0 < max_error:
        fail_input(f"max-error: must be > 0, got {max_error}")
    sim = simulate_timed(s, profile_path)
    reals = [run_real() for _ in range(runs)]
    failed = [r.outcome for r in reals if r.outcome != "completed"]
    rows = compare_iterations(sim, [r for r in reals if r.outcome == "completed"])
    med = median_abs_error(rows)
    if json_:
        write_json(finite({"rows": [x.to_dict() for x in rows], "median_abs_error": med, "runs": runs,
                           "quantile": QUANTILE, "real_outcomes": [r.outcome for r in reals],
                           "sim_outcome": sim.outcome, "max_error": max_error}),
                   sys.stdout, indent=None)
        sys.stdout.write("\n")
    else:
        print_iteration_table(rows, runs)
        if failed:
            say(f"real runs that did not complete: {', '.join(failed)} (left out)")
    exit_on(not failed and bool(rows) and med <= max_error)


def print_iteration_table(rows: list[IterationRow], runs: int) -> None:
    """Per iteration and rank: measured, simulated, error; then the median |error|."""
    t = table("iteration", "rank", "measured ms", "simulated ms", "error", title=None)
    for x in rows:
        t.add_row(x.label, str(x.rank), f"{x.measured_s * 1e3:.2f}", f"{x.simulated_s * 1e3:.2f}",
                  f"{x.error * 100:+.1f}%")
    show(t)
    say(f"median |error| over {len(rows)} (iteration, rank): {median_abs_error(rows) * 100:.1f}% "
        f"(measured: {QUANTILE:.0%} quantile of {runs} real run{'s' if runs > 1 else ''})")
