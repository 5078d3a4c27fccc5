"""Checks a report against a scenario's `[expect]` block: the scenario checks itself; and
`judge`, the one rule by which a scenario's run passes or fails."""

from __future__ import annotations

from dataclasses import dataclass

from simdist.check.classify import Verdict
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


@dataclass(frozen=True)
class Judgement:
    """Whether a run passed, as every command that judges one scenario says it (exit 0 or 1)."""

    passed: bool
    by: str  # "expect" (the scenario's own [expect]) or "checker" (no [expect]: the checker's verdict)
    unmet: list[str]  # the expectations that did not hold (by "expect")


def judge(report: Report, expect: Expect | None, verdict: Verdict) -> Judgement:
    """The one rule `simdist run` and `simdist check` exit on, so one verdict gives one code.

    A scenario with `[expect]` is a test of itself: it passes when every expectation holds,
    also when it expects a hang (the bundled deadlock families do). Without `[expect]` it
    passes when the checker finds nothing: the run completed, no mismatch, the loop's
    invariants hold."""
    if expect is not None:
        unmet = check_expectations(report, expect)
        return Judgement(not unmet, "expect", unmet)
    return Judgement(not verdict.failed, "checker", [])
