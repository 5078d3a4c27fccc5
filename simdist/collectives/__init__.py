"""Collective algorithms: schedules built from a few patterns (`generators`), registered with
closed-form costs (`algorithms`), and what ProcessGroupGloo runs per op (`gloo`); see
docs/cost-model.md."""

from simdist.collectives.algorithms import (
    REGISTRY,
    Algorithm,
    algorithms_for,
    get,
    make_schedule,
    resolve,
)
from simdist.collectives.execute import run_times, run_values, schedule_time
from simdist.collectives.schedule import Schedule, Transfer

__all__ = [
    "REGISTRY",
    "Algorithm",
    "Schedule",
    "Transfer",
    "algorithms_for",
    "get",
    "make_schedule",
    "resolve",
    "run_times",
    "run_values",
    "schedule_time",
]
