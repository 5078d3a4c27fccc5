"""How a report and its judgement are printed, the same for every command and both kinds
of input (scenario files and scripts): the per-rank table, outcome, findings, notes, and
`compare`'s comparison with the races of the real run it names."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import TYPE_CHECKING, Any

from simdist.check.classify import Verdict
from simdist.cli.console import ExitCode, say, show, table
from simdist.expect import Judgement
from simdist.jsonout import finite
from simdist.report import Report

if TYPE_CHECKING:
    from simdist.compare import Comparison
    from simdist.races import Race

_OUTCOME_STYLE = {"completed": "green", "hang": "yellow", "error": "red"}


def print_report(report: Report, title: str | None = None) -> None:
    """Per-rank table, outcome, findings and the explanation of any hang or error."""
    t = table("rank", "status", "inputs", "collectives", "time (s)", "observed / error",
              title=title or f"{report.scenario} ({report.source})", overflow="fold")
    for r in report.ranks:
        detail = ""
        if r.error:
            detail = f"{r.error.type}: {r.error.message}"
        elif r.blocked_in is not None:
            detail = f"blocked in {r.blocked_in.short()}"
            if r.waiting_in is not None and r.waiting_in is not r.blocked_in and r.waiting_in.seq != r.blocked_in.seq:
                detail += f"; waiting in {r.waiting_in.short()}"
        if r.observed:
            obs = ", ".join(f"{k}={_short(v)}" for k, v in r.observed.items())
            detail = f"{obs}; {detail}" if detail else obs
        t.add_row(str(r.rank), r.status, str(r.inputs_processed), str(len(r.trace)), f"{r.time:.6g}", detail)
    show(t)
    say("outcome: ", (report.outcome, _OUTCOME_STYLE[report.outcome]))
    for f in report.findings:
        say(("finding", "magenta"), f" {f.kind}: {f.detail}")
    for n in report.notes:
        say(n)


def _short(v: Any) -> str:
    if isinstance(v, list) and len(v) > 8:
        return f"[{', '.join(map(str, v[:3]))}, ... {len(v)} values, last {v[-1]}]"
    return str(v)


def say_judgement(j: Judgement, verdict: Verdict) -> None:
    """How the run fared: against its [expect], or (without one) by the checker's verdict."""
    for f in j.unmet:
        say(("expectation not met", "red"), f" {f}")
    if j.by == "expect" and j.passed:
        say(("all expectations met", "green"))
    if j.by == "checker" and not j.passed:
        say(("check failed", "red"), f" (no [expect]: the checker's verdict decides) {verdict.summary}")


@dataclass
class Compared:
    """`compare`'s verdict on a simulated and a real run, the same for scenarios and scripts:
    the comparison, the races of the real run that explain all of it (`simdist.races`), and
    what the command says and exits with: agree (0), a race (4: not a model difference, not
    agreement either), or differ (1)."""

    cmp: Comparison
    races: list[Race]

    @classmethod
    def of(cls, sim: Report, real: Report) -> Compared:
        from simdist.compare import compare_reports
        from simdist.races import named_races

        cmp = compare_reports(sim, real)
        return cls(cmp, named_races(sim, real, cmp))

    @property
    def verdict(self) -> str:
        return "agree" if self.cmp.agree else "race" if self.races else "differ"

    @property
    def code(self) -> ExitCode:
        return {"agree": ExitCode.OK, "race": ExitCode.RACE, "differ": ExitCode.CHECK_FAILED}[self.verdict]

    def jsonable(self) -> dict[str, Any]:
        """The head of `compare --json`: agree, verdict, races (each its kind, fields and line), comparison."""
        from simdist.races import race_jsonable

        return {"agree": self.cmp.agree, "verdict": self.verdict, "races": [race_jsonable(r) for r in self.races],
                "comparison": finite(asdict(self.cmp))}

    def say(self) -> None:
        from simdist.compare import format_comparison

        say(format_comparison(self.cmp, self.races))
