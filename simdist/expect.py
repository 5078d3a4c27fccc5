"""Checks a report against a scenario's `[expect]` block: the scenario checks itself."""

from __future__ import annotations

from simdist.compare import values_equal
from simdist.report import Report
from simdist.scenario import Expect


def check_expectations(report: Report, expect: Expect | None) -> list[str]:
    """Every unmet expectation as one line; empty when all hold (or there is none)."""
    if expect is None:
        return []
    failures: list[str] = []
    if expect.outcome is not None and report.outcome != expect.outcome:
        failures.append(f"outcome: expected {expect.outcome}, got {report.outcome}")
    if expect.inputs_processed is not None:
        got = [r.inputs_processed for r in report.ranks]
        if got != expect.inputs_processed:
            failures.append(f"inputs_processed: expected {expect.inputs_processed}, got {got}")
    if expect.status is not None:
        got_s = [r.status for r in report.ranks]
        if got_s != expect.status:
            failures.append(f"status: expected {expect.status}, got {got_s}")
    if expect.collectives is not None:
        got_c = [len(r.trace) for r in report.ranks]
        if got_c != expect.collectives:
            failures.append(f"collectives: expected {expect.collectives}, got {got_c}")
    for k, sub in expect.errors.items():
        err = report.ranks[int(k)].error
        if err is None or sub not in err.message:
            failures.append(f"errors.{k}: expected a message containing {sub!r}, got {err.message if err else None!r}")
    for name, per_rank in expect.observed.items():
        for r, want in enumerate(per_rank):
            got_v = report.ranks[r].observed.get(name)
            if not values_equal(got_v, want):
                failures.append(f"observed.{name}[{r}]: expected {want!r}, got {got_v!r}")
    return failures
