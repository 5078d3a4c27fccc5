"""One simulated rank: executes its program's actions on the engine through the torch models.

The simulator's driver of `simdist.program` (the real backend's is
`real_backend.torchrank`): everything the scenario means was decided by the interpreter;
here an action becomes what the modelled torch objects (`simdist.torchmodels`) and the
engine do with it, in simulated time.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from simdist.engine.calls import Work
from simdist.engine.core import Engine, RankRaised
from simdist.engine.values import Payload
from simdist.program.actions import (
    P2P,
    Action,
    Backward,
    BuildJoinable,
    BuildModel,
    BuildOptimizer,
    CallJoinable,
    Collective,
    Compute,
    EndIteration,
    EnterJoin,
    EnterPhase,
    ExitJoin,
    Fail,
    Forward,
    SetupDone,
    SkipCollective,
    StepOptimizer,
    WaitDeferred,
)
from simdist.program.interpret import rank_actions
from simdist.report import Span
from simdist.scenario import Model, Scenario
from simdist.torchmodels.ddp import DDPModel
from simdist.torchmodels.dist import Dist
from simdist.torchmodels.join import Join, Joinable
from simdist.torchmodels.joinables import ScenarioJoinable
from simdist.torchmodels.registry import JOINABLE_KINDS
from simdist.torchmodels.zero import ZeroModel


@dataclass
class RankOutcome:
    """What the rank's program leaves behind, filled in as it runs."""

    inputs_processed: int = 0
    observed: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)  # the Python warnings the rank showed
    compute: list[Span] = field(default_factory=list)  # the rank's compute steps, as they ran
    phases: list[tuple[float, str, int | None]] = field(default_factory=list)  # (t, phase, iteration) entered


class SimRank:
    """Builds the modelled torch objects for one rank and executes its actions."""

    def __init__(self, scenario: Scenario, engine: Engine, rank: int):
        self.s = scenario
        self.engine = engine
        self.rank = rank
        self.state = engine.ranks[rank]
        self.dist = Dist(engine, rank)
        self.out = RankOutcome(warnings=self.dist.warnings, compute=self.dist.compute_spans)
        self.specs: dict[str, Model] = {}  # the DDP models this rank holds, by name
        self.ddp: dict[str, DDPModel] = {}
        self.zero: ZeroModel | None = None
        self.optimized: tuple[str, ...] = ()  # the models whose parameters the optimizer updates
        self.custom: dict[str, ScenarioJoinable] = {}
        self.join: Join | None = None
        self.deferred: list[tuple[Work, str | None]] = []  # waited at the end of the iteration

    def run(self) -> Generator[Any, Any, None]:
        # The kinds that come every iteration are done here: the two that never wait without
        # a generator for each (a third of a loop's actions), DDP's passes without `execute`'s
        # generator around the model's (one level less for every collective they wait on);
        # every other kind by `execute`.
        for action in rank_actions(self.s, self.rank, self.latest):
            kind = type(action)
            if kind is EnterPhase:
                self.state.phase, self.state.iteration = action.phase, action.iteration
                self.out.phases.append((self.engine.env.now, action.phase, action.iteration))
            elif kind is EndIteration:
                self.out.inputs_processed += 1
            elif kind is Forward:
                yield from self.ddp[action.model].forward(action.no_sync)
            elif kind is Backward:
                yield from self.ddp[action.model].backward(action.seconds)
            else:
                yield from self.execute(action)

    def latest(self, name: str) -> Any:
        """The latest result observed under `name` (what a `flag` condition reads)."""
        values = self.out.observed.get(name)
        return values[-1] if values else None

    def execute(self, a: Action) -> Generator[Any, Any, None]:
        """Do what `a` says, in simulated time (`EnterPhase`, `EndIteration`, `Forward` and
        `Backward`: `run`)."""
        match a:  # the per-iteration kinds first: this is the simulator's inner loop
            case StepOptimizer():
                if self.zero is not None:
                    yield from self.zero.step()
                for name in self.optimized:
                    self.ddp[name].zero_grad()
            case Collective():
                yield from self._collective(a)
            case WaitDeferred():
                deferred, self.deferred = self.deferred, []
                for work, observe in deferred:
                    self._observe(observe, (yield from work.wait()))
            case CallJoinable(name=name, num_allreduces=n):
                yield from self.custom[name].call(n)
            case P2P():
                yield from self._p2p(a)
            case Compute(seconds=seconds):
                yield from self.dist.compute(seconds)
            case SkipCollective(warning=warning):
                self.dist.warn(warning)
            case _:
                yield from self._setup(a)

    def _setup(self, a: Action) -> Generator[Any, Any, None]:
        """The actions that happen once: building objects, entering and leaving Join, failing."""
        match a:
            case BuildModel(model=m, ddp_kwargs=kwargs):
                self.specs[m.name] = m
                self.ddp[m.name] = DDPModel(self.dist, m.numels(), m.dims(), m.dtype, m.buffers, m.unused_params,
                                            group=m.group, **kwargs)
                yield from self.ddp[m.name].construct()
            case BuildOptimizer(optimizer=opt, models=names, group=group):
                self.optimized = names
                if opt.zero:
                    specs = [self.specs[n] for n in names]
                    self.zero = ZeroModel(self.dist, [k for m in specs for k in m.numels()],
                                          [m.dtype for m in specs for _ in m.params], group)
            case BuildJoinable(name=name, kind=kind, group=group):
                self.custom[name] = JOINABLE_KINDS[kind].sim(self.dist, name, group)
            case EnterJoin():
                objs = [self._joinable(n) for n in a.joinables]
                self.join = Join(objs, a.enable, a.throw_on_early_termination, **a.kwargs)
            case ExitJoin():
                assert self.join is not None
                yield from self.join.exit(None)
            case Fail(message=message):
                raise RankRaised("RuntimeError", message)
            case SetupDone():
                pass
            case _:  # pragma: no cover - the interpreter yields no other kind
                raise AssertionError(a)

    def _joinable(self, name: str) -> Joinable:
        if name in self.ddp:
            return self.ddp[name]
        if name == "zero":
            assert self.zero is not None
            return self.zero
        return self.custom[name]

    def collect_observed(self) -> None:
        """Joinables' and DDP's values as they stand now (also for a rank that hung)."""
        for j in self.custom.values():
            self.out.observed.update(j.observed())
        for name, ddp in self.ddp.items():
            if self.specs[name].observe_grad:
                self.out.observed[f"{name}.grad"] = list(ddp.observed_grads)

    def _observe(self, name: str | None, res: Payload) -> None:
        if name:
            self.out.observed.setdefault(name, []).append(res.observed())

    def _finish(self, work: Work, wait: str, observe: str | None) -> Generator[Any, Any, None]:
        """Wait on `work` now, at the end of the iteration, or never, as the action says."""
        if wait == "never":
            return
        if wait == "end_of_iteration":
            self.deferred.append((work, observe))
            return
        self._observe(observe, (yield from work.wait()))

    def _collective(self, a: Collective) -> Generator[Any, Any, None]:
        payload = Payload.full(a.numel, a.dtype, a.value)
        work = self.dist.issue(a.op, payload, origin=a.origin, group=a.group, reduce_op=a.reduce_op, root=a.root,
                               async_op=a.async_op)
        yield from self._finish(work, a.wait, a.observe)

    def _p2p(self, a: P2P) -> Generator[Any, Any, None]:
        payload = Payload.full(a.numel, a.dtype, a.value)
        work = self.engine.p2p(self.rank, a.op, payload, a.peer, tag=a.tag, origin=a.origin)
        yield from self._finish(work, a.wait, a.observe)
