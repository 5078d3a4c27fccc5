"""simdist's pytest plugin: scenario files as test items, and a fixture to run scenarios from tests.

A scenario with an `[expect]` table is a test of itself (`simdist.expect.judge`); with
``pytest --simdist PATH...`` pytest collects every such TOML file under PATH as one test
item named by the scenario's `name`, so everything pytest does with items works on them:
``-k``, ``-x``, ``--junitxml``, ``-n`` (pytest-xdist), ``--lf``. ``--simdist-real`` also runs
each on real torch.distributed processes (Gloo) and requires the simulator and the real run
to agree and the real run to meet the expectations too. Files without `[expect]`, fuzzing
templates (a `[fuzz]` table) and other TOML files are not collected; a scenario file that
does not load is a failing item, its problems one line each.

The `simdist` fixture (`ScenarioRunner`) loads, simulates, checks and compares scenarios
from a user's own tests; its sibling `simdist_script` (`simdist.pytest_scripts.ScriptRunner`)
runs, compares and fuzzes the user's own training script on simulated ranks, in the test's
`tmp_path`, its ranks forked by fork servers kept for the session (docs/testing.md). The plugin is registered under the `pytest11`
entry point, so installing simdist is all it takes; it does nothing unless asked.
"""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import TYPE_CHECKING, Any

import pytest
import tomllib

from simdist.pytest_scripts import ForkServers, ScriptRunner

if TYPE_CHECKING:
    from simdist.compare import Comparison
    from simdist.report import Report
    from simdist.scenario import Scenario

MARKER = "simdist"


def pytest_addoption(parser: pytest.Parser) -> None:
    group = parser.getgroup("simdist", "simdist scenario files")
    group.addoption("--simdist", action="store_true", default=False,
                    help="collect scenario TOML files that have an [expect] table as test items (named by the "
                         "scenario's name); each passes when its run meets its expectations")
    group.addoption("--simdist-real", action="store_true", default=False,
                    help="with --simdist: also run each scenario on real torch.distributed processes and require "
                         "the simulator and the real run to agree")


def pytest_configure(config: pytest.Config) -> None:
    config.addinivalue_line("markers", f"{MARKER}: a scenario file collected by simdist's pytest plugin")


def pytest_collect_file(file_path: Path, parent: pytest.Collector) -> pytest.Collector | None:
    if file_path.suffix != ".toml" or not parent.config.getoption("simdist"):
        return None
    data = _peek(file_path)
    if data is not None and (not isinstance(data.get("expect"), dict) or "fuzz" in data):
        return None
    return ScenarioFile.from_parent(parent, path=file_path)


def _peek(path: Path) -> dict[str, Any] | None:
    """The file's TOML, or None when it does not parse (then it is a failing item)."""
    try:
        return tomllib.loads(path.read_text(encoding="utf-8"))
    except (OSError, UnicodeDecodeError, tomllib.TOMLDecodeError):
        return None


class ScenarioFile(pytest.File):
    """A scenario file: one item, named by the scenario's `name` (the file's stem without one)."""

    def collect(self) -> list[ScenarioItem]:
        data = _peek(self.path) or {}
        name = data.get("name")
        return [ScenarioItem.from_parent(self, name=name if isinstance(name, str) and name else self.path.stem)]


class ScenarioFailed(Exception):
    """A scenario's run failed its test: the lines say why."""


class ScenarioItem(pytest.Item):
    """One scenario, judged as `simdist run` judges it (and, with --simdist-real, on real Gloo)."""

    def __init__(self, **kwargs: Any):
        super().__init__(**kwargs)
        self.add_marker(MARKER)

    def runtest(self) -> None:
        runner = ScenarioRunner()
        s = runner.load(self.path)
        runner.check(s)
        if self.config.getoption("simdist_real"):
            runner.compare(s)

    def repr_failure(self, excinfo: pytest.ExceptionInfo[BaseException], style: Any = None) -> str:
        from simdist.errors import SimdistError

        if isinstance(excinfo.value, (ScenarioFailed, SimdistError)):
            return f"{self.path}: {self.name}\n{excinfo.value}"
        return str(super().repr_failure(excinfo, style))

    def reportinfo(self) -> tuple[Path, int | None, str]:
        return self.path, None, f"scenario {self.name}"


class ScenarioRunner:
    """Scenarios from your own tests, as the `simdist` fixture: `load` a file or a dict (with
    top-level keys overridden, e.g. ``inputs={"counts": [3, 5]}``), `simulate` it, `check`
    it against its `[expect]` (or the checker's verdict without one), `compare` it with a
    real run. A failed check fails the test with the lines `simdist run` prints."""

    def __init__(self, tmp_path_factory: pytest.TempPathFactory | None = None):
        self._tmp = tmp_path_factory  # where real runs keep their logs (None: removed afterwards)

    def load(self, source: str | Path | dict[str, Any] | Scenario, **overrides: Any) -> Scenario:
        # simdist is imported when a scenario is first used, not when pytest loads the plugin
        from simdist.scenario import Scenario, parse_scenario, read_toml, scenario_to_dict

        if isinstance(source, Scenario):
            if not overrides:
                return source
            data, where = scenario_to_dict(source), "<scenario>"
        elif isinstance(source, dict):
            data, where = dict(source), "<dict>"
        else:
            data, where = read_toml(source), str(source)
        return parse_scenario({**data, **overrides}, source=where)

    def simulate(self, source: str | Path | dict[str, Any] | Scenario, **overrides: Any) -> Report:
        from simdist.sim import simulate

        return simulate(self.load(source, **overrides))

    def check(self, source: str | Path | dict[str, Any] | Scenario, **overrides: Any) -> Report:
        """Simulate and judge: the scenario's `[expect]` must hold (without one, the checker
        must find nothing). Returns the report; raises ScenarioFailed (a test failure) otherwise."""
        from simdist.check.explain import annotate_report
        from simdist.expect import judge

        s = self.load(source, **overrides)
        report = self.simulate(s)
        verdict = annotate_report(report, s)
        j = judge(report, s.expect, verdict)
        if not j.passed:
            why = [f"expectation not met: {u}" for u in j.unmet] or [f"check failed: {verdict.summary}"]
            raise ScenarioFailed("\n".join(why + report.notes))
        return report

    def compare(self, source: str | Path | dict[str, Any] | Scenario, timeout_s: float | None = None,
                **overrides: Any) -> Comparison:
        """Run it in the simulator and on real processes of this host: they must agree, and the
        real run must meet the scenario's `[expect]`. A race of the real run is no agreement,
        but the failure says so (`simdist.races`), as `simdist compare` does."""
        import simdist
        from simdist.compare import compare_reports, format_comparison
        from simdist.expect import check_expectations
        from simdist.races import named_races

        s = self.load(source, **overrides)
        workdir = self._tmp.mktemp("simdist-real") if self._tmp is not None else None
        real = simdist.run_real(s, timeout_s=timeout_s, workdir=workdir)
        sim = self.simulate(s)
        cmp = compare_reports(sim, real)
        unmet = check_expectations(real, s.expect)
        if not cmp.agree or unmet:
            said = format_comparison(cmp, named_races(sim, real, cmp))
            raise ScenarioFailed("\n".join([said] + [f"real: expectation not met: {u}" for u in unmet]))
        return cmp


@pytest.fixture(scope="session")
def simdist(tmp_path_factory: pytest.TempPathFactory) -> ScenarioRunner:
    """Load, simulate, check and compare scenarios from your tests (`ScenarioRunner`).
    Session-scoped, so it also serves hypothesis `@given` tests."""
    return ScenarioRunner(tmp_path_factory)


@pytest.fixture(scope="session")
def simdist_fork_servers(tmp_path_factory: pytest.TempPathFactory) -> Iterator[ForkServers]:
    """The session's fork servers for `simdist_script` (each pytest-xdist worker has its own),
    started on first use and ended with the session; the ranks' stdout and stderr go to
    `simdist-ranks.log` in the session's temporary folder."""
    servers = ForkServers(tmp_path_factory.getbasetemp() / "simdist-ranks.log")
    try:
        yield servers
    finally:
        servers.close()


@pytest.fixture
def simdist_script(simdist_fork_servers: ForkServers, tmp_path: Path) -> ScriptRunner:
    """Run, compare and fuzz your own training script on simulated ranks (`ScriptRunner`).
    Function-scoped: each test's runs work in its own `tmp_path`."""
    return ScriptRunner(simdist_fork_servers, tmp_path)
