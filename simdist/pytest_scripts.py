"""The `simdist_script` fixture: a user's own training script on simulated ranks, from pytest.

"My train.py never hangs or mismatches with uneven batches at 2-4 ranks" as a test of the
user's suite, run in CI without GPUs. `ScriptRunner` runs the script as `simdist run`,
`simdist compare` and `simdist fuzz` do (`simdist.script.api.execute`, `compare_script`,
`simdist.fuzz.scripts.fuzz_script`) and returns what the Python API returns (`Report`,
`Comparison`, `ScriptFuzzResult`); `assert_ok` fails the test with the explanation simdist
prints (which rank waits in which collective, at which line, why; a comparison's first
difference; a fuzz counterexample and the commands that replay it).

Why a fixture of its own, beside the session-scoped `simdist` (scenarios): a script is a
program with a working directory. Each test's runs start in the test's `tmp_path`, so what
the script writes (checkpoints, logs, the fuzzer's replay files, what `compare` sets aside
between its two sides) lands in that test's folder, never in the checkout or in another
test's (pytest-xdist workers run side by side); a fixture with a per-test folder is
function-scoped. The rank processes come from fork servers (`simdist.script.zygote`) kept
for the whole session by `ForkServers` (one per mode and simulated GPU count, started on
first use), so a run forks its ranks instead of starting an interpreter and importing torch
for each (a scenario runner needs no processes, hence no such split).

Every process of a run ends with it: `execute` ends its ranks on any exit (a failure, the
watchdog's `timeout_s`, Ctrl-C); the fork servers end at the session's end and die with
pytest if it is killed (PR_SET_PDEATHSIG), taking what they forked with them.
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:  # the engine, torch's launcher and hypothesis load on a script's first run
    from simdist.compare import Comparison
    from simdist.fuzz.scripts import ScriptFuzzResult, Space
    from simdist.report import Report
    from simdist.script.zygote import Zygote

Batches = str | int | Sequence[int] | None
DEFAULT_TIMEOUT_S = 60.0  # watchdog: seconds without communication (a simulated hang is found without it)


class ScriptFailed(AssertionError):
    """A script's run failed (`assert_ok`): the message is what simdist prints about it."""


@dataclass
class ForkServers:
    """The session's fork servers, one per (mode, GPU count), started on first use; the
    ranks' own stdout and stderr go to `log` (their printed lines are in the report too).
    `servers`: ones already running (a suite that keeps its own: override the
    `simdist_fork_servers` fixture with them); `close` ends every one."""

    log: Path
    servers: dict[tuple[str, int], Zygote] = field(default_factory=dict)

    def get(self, mode: str, gpus: int) -> Zygote:
        from simdist.script.zygote import Zygote

        key = (mode, gpus)
        if key not in self.servers:
            with open(self.log, "ab") as out:  # the server keeps its own descriptor
                self.servers[key] = Zygote(None, mode=mode, gpus=gpus, stdout=out, stderr=out)
        return self.servers[key]

    def close(self) -> None:
        while self.servers:
            self.servers.popitem()[1].close()


def explain(result: Report | Comparison | ScriptFuzzResult) -> list[str]:
    """Why `result` fails, as simdist prints it; [] when it passes (a report: the checker finds
    nothing, as `simdist run` judges a script; a comparison: simulator and real Gloo agree; a
    search: no counterexample)."""
    from simdist.check.classify import judge
    from simdist.compare import Comparison, format_comparison
    from simdist.fuzz.scripts import ScriptFuzzResult
    from simdist.report import Report

    if isinstance(result, Report):
        v = judge(result, list(result.findings))
        if not v.failed:
            return []
        return ([f"{result.scenario} ({result.source}, {result.world_size} ranks): check failed: {v.summary}"]
                + [f"finding {f.kind}: {f.detail}" for f in result.findings] + list(result.notes))
    if isinstance(result, Comparison):
        return [] if result.agree else format_comparison(result).splitlines()
    if isinstance(result, ScriptFuzzResult):
        return result.lines() if result.failed else []
    raise TypeError(f"assert_ok: expected a Report, Comparison or ScriptFuzzResult, got {type(result).__name__}")


class ScriptRunner:
    """A script on simulated ranks from a test, as the `simdist_script` fixture: `run` it
    (or `check` it: run and `assert_ok`), `compare` it with real Gloo, `fuzz` its per-rank
    batch counts and world size; `assert_ok` fails the test with simdist's explanation.

    Arguments as the CLI's: `nproc_per_node` starts that many ranks as torchrun would (None:
    the script starts its own, e.g. `mp.spawn`); `batches` caps each rank's DataLoaders
    ("2,3", [2, 3] or 2); `args` are the script's own; `timeout_s` is the watchdog (seconds
    without communication); `gpus_per_node` the node's GPUs (0: a CPU-only node; default 8,
    or one per rank above 8). A relative script path is taken from where pytest runs; the
    script runs in `cwd` (default: the test's `tmp_path`)."""

    def __init__(self, servers: ForkServers, tmp_path: Path):
        self.fork_servers, self.tmp_path = servers, tmp_path

    def run(self, script: str | os.PathLike, args: Sequence[str] = (), *, nproc_per_node: int | None = None,
            batches: Batches = None, timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None,
            cwd: str | os.PathLike | None = None, gpus_per_node: int | None = None) -> Report:
        """`simdist run SCRIPT`: the report (`simdist.script.run_script`'s), not judged."""
        from simdist.script.api import execute
        from simdist.script.env import SIM

        path = _checked(script, batches, nproc_per_node, gpus_per_node)
        with contextlib.chdir(cwd or self.tmp_path):
            return execute(path, _args(args), nproc_per_node=nproc_per_node, batches=batches, timeout_s=timeout_s,
                           backend=backend, zygote=self._zygote(SIM, nproc_per_node, gpus_per_node)).report

    def check(self, script: str | os.PathLike, args: Sequence[str] = (), **kw: Any) -> Report:
        """`run`, then `assert_ok`: the test fails unless the checker finds nothing."""
        __tracebackhide__ = True
        return self.assert_ok(self.run(script, args, **kw))

    def compare(self, script: str | os.PathLike, args: Sequence[str] = (), *, nproc_per_node: int | None = None,
                batches: Batches = None, timeout_s: float = DEFAULT_TIMEOUT_S,
                cwd: str | os.PathLike | None = None, gpus_per_node: int | None = None) -> Comparison:
        """`simdist compare SCRIPT`: simulated, then on real Gloo (CPU) from the same files,
        diffed rank by rank (`simdist.compare.compare_reports`), not judged. What the
        simulated side wrote is set aside under `cwd` before the real side starts."""
        from simdist.compare import compare_reports
        from simdist.script.api import compare_script
        from simdist.script.env import GLOO

        path = _checked(script, batches, nproc_per_node, gpus_per_node)
        with contextlib.chdir(cwd or self.tmp_path):
            both = compare_script(path, _args(args), zygotes=lambda mode: self._zygote(mode, nproc_per_node,
                                                                                       gpus_per_node),
                                  nproc_per_node=nproc_per_node, backend=GLOO, timeout_s=timeout_s, batches=batches)
        return compare_reports(both.sim.report, both.real.report)

    def fuzz(self, script: str | os.PathLike, args: Sequence[str] = (), *, budget: int = 30, seed: int = 0,
             nproc_per_node_range: tuple[int, int] | None = None, batches_range: tuple[int, int] = (1, 8),
             timeout_s: float = DEFAULT_TIMEOUT_S, backend: str | None = None, shrink: bool = True,
             cwd: str | os.PathLike | None = None) -> ScriptFuzzResult:
        """`simdist fuzz SCRIPT`: search the world sizes (`nproc_per_node_range`, torchrun-style;
        None: the script's own) and per-rank DataLoader caps (`batches_range`) for failures,
        each shrunk and written as a replay file under `tmp_path/failures`; `seed` makes the
        search the same on every run (CI). Not judged: `assert_ok` it."""
        from simdist.fuzz.scripts import fuzz_script
        from simdist.script.env import SIM

        space = _space(Path(script).resolve(), args, nproc_per_node_range, batches_range, backend, timeout_s)
        with contextlib.chdir(cwd or self.tmp_path):
            return fuzz_script(space, budget=budget, seed=seed, out_dir=self.tmp_path / "failures", shrink=shrink,
                               zygote=self._zygote(SIM, space.worlds[1] if space.worlds else None))

    def assert_ok(self, result: Any) -> Any:
        """`result` (a `Report`, `Comparison` or `ScriptFuzzResult`) when it passes; else the
        test fails (`ScriptFailed`, an AssertionError) with simdist's explanation as its
        message, which is also what `--junitxml` records."""
        __tracebackhide__ = True  # the failure points at the test's line, not at this helper
        why = explain(result)
        if why:
            raise ScriptFailed("\n".join(why))
        return result

    def _zygote(self, mode: str, world: int | None, gpus: int | None = None) -> Zygote:
        from simdist.script.api import default_gpus

        return self.fork_servers.get(mode, default_gpus(world) if gpus is None else gpus)


def _args(args: Sequence[str]) -> list[str]:
    """The script's own arguments as a list ("--epochs 2" would become its characters)."""
    from simdist.errors import ScriptError

    if isinstance(args, str | bytes):
        raise ScriptError(f"args: the script's arguments as a list, e.g. {args.split()!r}, got the string {args!r}")
    return [str(a) for a in args]


def _checked(script: str | os.PathLike, batches: Batches, nproc_per_node: int | None,
             gpus_per_node: int | None = None) -> Path:
    """The script's absolute path, once it, the caps and the GPU count are found good (bad
    input: ScriptError naming the field, before a fork server is started for it)."""
    from simdist.script.api import check_gpus, check_script, parse_caps

    path = Path(script).resolve()
    check_script(path)
    parse_caps(batches, nproc_per_node)
    if gpus_per_node is not None:
        check_gpus(gpus_per_node, "gpus_per_node")
    return path


def _space(path: Path, args: Sequence[str], worlds: tuple[int, int] | None, batches: tuple[int, int],
           backend: str | None, timeout_s: float) -> Space:
    """The fuzzer's `Space`; bad ranges raise ScriptError naming the argument
    (`fuzz.scripts.checked_space`, the CLI's checks)."""
    from simdist.fuzz.scripts import checked_space
    from simdist.script.api import check_script

    check_script(path)
    return checked_space(path, tuple(_args(args)), worlds, batches, backend, timeout_s)
