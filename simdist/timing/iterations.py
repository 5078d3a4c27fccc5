"""Whole training iterations timed: the simulator's per-iteration time against the real
backend's wall clock, rank by rank (`simdist compare SCENARIO --timing`, and the
iteration section of bench/timing_predict.py).

Both sides cut a rank's run the same way (`simdist.report.phase_spans`: a phase lasts from
its `EnterPhase` to the next): "loop <i>" is the rank's iteration on input i, from the
start of its loop body to the start of the next (forward, compute, backward with its
bucket all-reduces, optimizer step, deferred waits), and "join_exit" is a rank's time in
`Join.__exit__`, where a rank out of inputs shadows the others' iterations.

The simulator times an iteration with what the scenario says and what it was calibrated
on, nothing fitted to iterations: `compute` steps and a `backward`'s `seconds` take their
seconds (the real backend sleeps them), every collective the calibrated Gloo model's time
(`simdist calibrate`'s primitives: `simdist.network.gloo_time`), a process group's
collectives one after another (`CostModel.queued`), DDP's buckets launched while the
backward computes (`simdist.torchmodels.ddp`). The measured value of an (iteration, rank)
over several real runs is a low quantile (other jobs on the machine only ever add time),
the statistic the collective benchmarks use.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import numpy as np

from simdist.errors import ScenarioError
from simdist.network.profile import Profile, load_profile
from simdist.report import Report
from simdist.scenario import Scenario
from simdist.schema import BackwardStep, ComputeStep, SleepStep

#: Phases compared: a rank's loop iterations and its Join exit (its shadow iterations).
TIMED_PHASES = ("loop", "join_exit")
QUANTILE = 0.25  # of the real runs' values per (iteration, rank), as the benchmarks' op_p25


@dataclass
class IterationRow:
    """One (iteration, rank): what the real runs measured and what the simulator says."""

    label: str  # "loop 3", "join_exit"
    rank: int
    measured_s: float  # QUANTILE over `runs`
    simulated_s: float
    runs: list[float]  # each real run's value

    @property
    def error(self) -> float:
        """(simulated - measured) / measured."""
        return (self.simulated_s - self.measured_s) / self.measured_s if self.measured_s > 0 else float("inf")

    def to_dict(self) -> dict:
        return {**asdict(self), "error": self.error}


def has_timed_work(s: Scenario) -> bool:
    """Whether the loop computes: a `compute`/`sleep` step or a `backward` with `seconds`."""
    for st in s.loop:
        if isinstance(st, (ComputeStep, SleepStep)) or (isinstance(st, BackwardStep) and st.seconds):
            secs = st.seconds if isinstance(st.seconds, list) else [st.seconds]
            if any(x > 0 for x in secs):
                return True
    return False


def timing_profile(s: Scenario, path: Path | None) -> Profile:
    """The calibrated profile an iteration timing uses: `path` (`--profile`), else the
    scenario's `topology.profile`; it must hold host primitives (`simdist calibrate`).
    Checks the scenario too: a ScenarioError (one line, naming the field) otherwise."""
    if not has_timed_work(s):
        raise ScenarioError("loop: --timing needs a loop that computes (a 'compute' step or a 'backward' with "
                            "seconds); this one's iterations take no time of their own")
    if s.backend != "gloo":
        raise ScenarioError(f"backend: --timing predicts Gloo iterations, not {s.backend!r}")
    field = "--profile" if path is not None else "topology.profile"
    where = path if path is not None else getattr(s.topology, "profile", None)
    if not where:
        raise ScenarioError("--profile: --timing needs a calibrated profile (`simdist calibrate --out FILE`), "
                            "here or as topology.profile")
    prof = load_profile(where, field)
    if prof.host is None:
        raise ScenarioError(f"{field}: {where} has no host primitives (write one with `simdist calibrate`)")
    return prof


def iteration_times(report: Report) -> dict[tuple[str, int], float]:
    """Seconds per (phase label, rank) of the timed phases, from the report's phase spans."""
    return {(sp.label, r.rank): sp.t_end - sp.t_begin for r in report.ranks for sp in r.phases
            if sp.label.split(" ")[0] in TIMED_PHASES}


def compare_iterations(sim: Report, reals: list[Report], quantile: float = QUANTILE) -> list[IterationRow]:
    """One row per (timed phase, rank) the simulator ran and a real run measured, ordered by
    rank then phase as they ran."""
    measured = [iteration_times(r) for r in reals]
    rows = []
    for r in sim.ranks:
        for sp in r.phases:
            key = (sp.label, r.rank)
            if sp.label.split(" ")[0] not in TIMED_PHASES:
                continue
            runs = [m[key] for m in measured if key in m]
            if runs:
                rows.append(IterationRow(sp.label, r.rank, float(np.quantile(runs, quantile)),
                                         sp.t_end - sp.t_begin, runs))
    return rows


def median_abs_error(rows: list[IterationRow]) -> float:
    """The median |relative error| over the rows (nan without rows)."""
    return float(np.median([abs(x.error) for x in rows])) if rows else float("nan")
