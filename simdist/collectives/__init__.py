"""Collective algorithms as schedules with closed-form costs (see docs/cost-model.md)."""

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
