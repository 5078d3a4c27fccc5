"""simdist: a discrete-event simulator and correctness checker for PyTorch distributed training.

The public Python API: what to script against (tests, notebooks, CI checks of one's own
training loops). Everything else in the package is internal and may move; the names below
stay. Each is loaded on first use (PEP 562 module `__getattr__`), so `import simdist` is
cheap and never imports torch or `real_backend`.

Scenarios
    load_scenario(path), parse_scenario(dict) -> Scenario
        A scenario file or dict, validated; bad input raises `ScenarioError` with one line
        naming the field. Build scenarios in code and get the checks a file gets.
Simulate and check
    simulate(scenario) -> Report
        Every rank's collectives, outcome, hang or error, in milliseconds and without
        processes: the fast way to try many input counts and loop shapes.
    check_run(report, scenario) -> Verdict
        Whether the run failed and why (hang, mismatch, peer exited, broken invariant),
        with a stable signature to deduplicate failures.
    explain_report(report, scenario) -> list[str]
        The same explanation `simdist run` prints: which rank waits in which collective,
        and the fix that fits.
    check_expectations(report, expect) -> list[str]
        A scenario's own `[expect]` block checked against a report (empty list: all met).
Real runs and comparison
    run_real(scenario, timeout_s=..., workdir=...) -> Report
        The same scenario on real torch.distributed processes of this host (Gloo on CPU).
        Imported from `real_backend.launch` only when first used: this lazy re-export and
        the CLI are the only places where `simdist` reaches `real_backend`.
    compare_reports(sim, real) -> Comparison, format_comparison(comparison, races=()) -> str
        Where simulation and reality differ, rank by rank; the simulator's fidelity check.
    named_races(sim, real, comparison) -> list[Race]
        The races of real processes that explain every difference (empty: none, or something
        else differs too); `simdist compare` says "agree up to a race of the real run", exit 4.
Fuzzing
    load_template(path), parse_template(dict) -> Template
    fuzz_template(template, budget=..., seed=..., out_dir=...) -> FuzzResult
        Search a template's input counts and loop shapes for hangs and mismatches, shrink
        each failure and write it as a replayable scenario.
    template_scenarios(template) -> hypothesis strategy of (dict, Scenario)
        The same draws for your own `@given` tests (docs/fuzzing.md).
Reports
    Report, RankResult, TraceEntry, RankError, Finding
        What every run returns, simulated or real (docs/report.md); `Report.to_json()`.
Extending
    register_joinable(kind, cls)
        Add a custom joinable kind that scenarios can name in `[[joinables]]`.
Errors
    SimdistError (base), ScenarioError (bad scenario), HostError (this host cannot run it)
        Anything a user can cause; each reads as one line.
"""

from __future__ import annotations

import importlib
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # for type checkers and IDEs; at run time `__getattr__` loads each name
    from real_backend.launch import run_real as run_real
    from simdist.check.classify import Verdict as Verdict
    from simdist.check.classify import check_run as check_run
    from simdist.check.explain import explain_report as explain_report
    from simdist.compare import Comparison as Comparison
    from simdist.compare import compare_reports as compare_reports
    from simdist.compare import format_comparison as format_comparison
    from simdist.errors import HostError as HostError
    from simdist.errors import ScenarioError as ScenarioError
    from simdist.errors import SimdistError as SimdistError
    from simdist.expect import check_expectations as check_expectations
    from simdist.fuzz.runner import FuzzResult as FuzzResult
    from simdist.fuzz.runner import fuzz_template as fuzz_template
    from simdist.fuzz.strategies import template_scenarios as template_scenarios
    from simdist.fuzz.template import Template as Template
    from simdist.fuzz.template import load_template as load_template
    from simdist.fuzz.template import parse_template as parse_template
    from simdist.races import named_races as named_races
    from simdist.report import Finding as Finding
    from simdist.report import RankError as RankError
    from simdist.report import RankResult as RankResult
    from simdist.report import Report as Report
    from simdist.report import TraceEntry as TraceEntry
    from simdist.scenario import Scenario as Scenario
    from simdist.scenario import load_scenario as load_scenario
    from simdist.scenario import parse_scenario as parse_scenario
    from simdist.sim import simulate as simulate
    from simdist.torchmodels.registry import register_joinable as register_joinable

__version__ = "0.1.0"

# public name -> the module that defines it (the one definition; this is only a re-export)
_EXPORTS: dict[str, str] = {
    "load_scenario": "simdist.scenario",
    "parse_scenario": "simdist.scenario",
    "Scenario": "simdist.scenario",
    "simulate": "simdist.sim",
    "check_run": "simdist.check.classify",
    "Verdict": "simdist.check.classify",
    "explain_report": "simdist.check.explain",
    "check_expectations": "simdist.expect",
    "run_real": "real_backend.launch",
    "compare_reports": "simdist.compare",
    "format_comparison": "simdist.compare",
    "Comparison": "simdist.compare",
    "named_races": "simdist.races",
    "load_template": "simdist.fuzz.template",
    "parse_template": "simdist.fuzz.template",
    "Template": "simdist.fuzz.template",
    "fuzz_template": "simdist.fuzz.runner",
    "FuzzResult": "simdist.fuzz.runner",
    "template_scenarios": "simdist.fuzz.strategies",
    "Report": "simdist.report",
    "RankResult": "simdist.report",
    "TraceEntry": "simdist.report",
    "RankError": "simdist.report",
    "Finding": "simdist.report",
    "register_joinable": "simdist.torchmodels.registry",
    "SimdistError": "simdist.errors",
    "ScenarioError": "simdist.errors",
    "HostError": "simdist.errors",
}

__all__ = ["__version__", *_EXPORTS]


def __getattr__(name: str) -> Any:
    module = _EXPORTS.get(name)
    if module is None:
        raise AttributeError(f"module 'simdist' has no attribute {name!r}")
    value = getattr(importlib.import_module(module), name)
    globals()[name] = value  # later look-ups skip this function
    return value


def __dir__() -> list[str]:
    return sorted(set(globals()) | set(_EXPORTS))
