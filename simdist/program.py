"""One rank's program: the scenario's training loop, interpreted step by step on the engine.

This is the simulator's counterpart of `real_backend/worker.py`; both follow the step
semantics in docs/scenarios.md, so the same scenario issues the same collectives in both.
"""

from __future__ import annotations

from collections.abc import Generator
from dataclasses import dataclass, field
from typing import Any

from simdist.engine.core import Engine, RankRaised, Work
from simdist.engine.values import Payload
from simdist.scenario import (
    BackwardStep,
    CollectiveStep,
    ComputeStep,
    ForwardStep,
    JoinableCallStep,
    OptimizerStep,
    P2PStep,
    Scenario,
    SleepStep,
    Step,
)
from simdist.torchmodels.ddp import DDPModel
from simdist.torchmodels.dist import Dist
from simdist.torchmodels.join import Join, Joinable
from simdist.torchmodels.registry import JOINABLE_KINDS
from simdist.torchmodels.zero import ZeroModel
from simdist.vocab import reduce_op_of, root_of


@dataclass
class RankOutcome:
    """What the rank's program leaves behind, filled in as it runs."""

    inputs_processed: int = 0
    observed: dict[str, Any] = field(default_factory=dict)
    warnings: list[str] = field(default_factory=list)


def step_origin(step: Step, section: str, index: int) -> str:
    name = getattr(step, "name", None)
    return f"user.{name}" if name else f"user.{section}[{index}]"


def _fill_value(value: float | str, rank: int, iteration: int | None) -> float:
    if value == "rank":
        return float(rank)
    if value == "iteration":
        return float(-1 if iteration is None else iteration)
    return float(value)


class RankProgram:
    """Builds the modelled torch objects for one rank and runs its loop."""

    def __init__(self, scenario: Scenario, engine: Engine, rank: int):
        self.s = scenario
        self.engine = engine
        self.rank = rank
        self.dist = Dist(engine, rank)
        self.out = RankOutcome()
        self.ddp: DDPModel | None = None
        self.zero: ZeroModel | None = None
        self.custom: dict[str, Joinable] = {}
        self.join: Join | None = None
        self.loss_pending = False  # a forward's loss waiting for its backward

    # ------------------------------------------------------------------ top level
    def run(self) -> Generator[Any, Any, None]:
        yield from self._run(self.s, self.engine.ranks[self.rank])

    def _run(self, s: Scenario, rs: Any) -> Generator[Any, Any, None]:
        rs.phase = "init"
        if s.model is not None:
            self.ddp = DDPModel(self.dist, s.model)
            yield from self.ddp.construct()
        if s.optimizer is not None and s.optimizer.zero and s.model is not None:
            self.zero = ZeroModel(self.dist, s.model)
        for decl in s.joinables:
            cls = JOINABLE_KINDS[decl.kind]
            self.custom[decl.name] = cls(self.dist, decl.name, decl.group)  # type: ignore[call-arg]
        if s.join is not None:
            objs = [self._joinable(n) for n in s.join.joinables]
            self.join = Join(self.dist, objs, s.join.enabled, s.join.throw_on_early_termination, **s.join.kwargs)
        rs.phase = "loop"
        exc: RankRaised | None = None
        try:
            for i in range(s.counts()[self.rank]):
                rs.iteration = i
                pending: list[tuple[Work, str | None]] = []
                for k, step in enumerate(s.loop):
                    if step.applies(self.rank, i):
                        yield from self._step(step, "loop", k, i, pending)
                yield from self._wait_all(pending)
                self.loss_pending = False  # a loss is not carried into the next iteration
                self.out.inputs_processed += 1
        except RankRaised as e:
            exc = e
        rs.iteration = None
        if self.join is not None:
            rs.phase = "join_exit"
            try:
                yield from self.join.exit(exc)
            finally:
                self.out.warnings.extend(self.join.warnings)
        if exc is not None:
            raise exc
        rs.phase = "after"
        pending = []
        for k, step in enumerate(s.after):
            if step.applies(self.rank, None):
                yield from self._step(step, "after", k, None, pending)
        yield from self._wait_all(pending)

    def _wait_all(self, pending: list[tuple[Work, str | None]]) -> Generator[Any, Any, None]:
        """Wait on the iteration's deferred handles, in issue order, recording what they observe."""
        for work, observe in pending:
            res = yield from work.wait()
            self._observe(observe, res)

    def _joinable(self, name: str) -> Joinable:
        if name == "ddp":
            assert self.ddp is not None
            return self.ddp
        if name == "zero":
            assert self.zero is not None
            return self.zero
        return self.custom[name]

    def collect_observed(self) -> None:
        """Joinables' and DDP's values as they stand now (also for a rank that hung)."""
        for j in self.custom.values():
            observed = getattr(j, "observed", None)
            if observed is not None:
                self.out.observed.update(observed())
        if self.ddp is not None and self.s.model is not None and self.s.model.observe_grad:
            self.out.observed["ddp.grad"] = list(self.ddp.observed_grads)

    def _observe(self, name: str | None, res: Payload) -> None:
        if name:
            self.out.observed.setdefault(name, []).append(res.observed())

    # ------------------------------------------------------------------ steps
    def _step(self, step: Step, section: str, k: int, i: int | None,
              pending: list[tuple[Work, str | None]]) -> Generator[Any, Any, None]:
        d = self.dist
        if isinstance(step, (ComputeStep, SleepStep)):
            yield from d.compute(step.seconds)
        elif isinstance(step, ForwardStep):
            assert self.ddp is not None
            yield from self.ddp.forward(step.no_sync)
            self.loss_pending = True
        elif isinstance(step, BackwardStep):
            assert self.ddp is not None
            if not self.loss_pending:
                # the real loop has no loss to backward (torch would refuse a graph freed by
                # the previous backward): the worker raises this, so the model does too
                raise RankRaised("RuntimeError", f"{section}[{k}]: backward without a forward earlier in this iteration")
            self.loss_pending = False
            yield from self.ddp.backward()
        elif isinstance(step, OptimizerStep):
            if self.zero is not None:
                yield from self.zero.step()
            if self.ddp is not None:
                self.ddp.zero_grad()
        elif isinstance(step, JoinableCallStep):
            j = self.custom[step.joinable]
            n = step.num_allreduces
            if n is None and self.s.join is not None:
                n = int(self.s.join.kwargs.get("num_allreduces", 1))
            yield from j.call(n)  # type: ignore[attr-defined]
        elif isinstance(step, CollectiveStep):
            yield from self._collective(step, section, k, i, pending)
        elif isinstance(step, P2PStep):
            yield from self._p2p(step, section, k, i, pending)
        else:  # pragma: no cover - the scenario schema admits no other kind
            raise AssertionError(step)

    def _collective(self, st: CollectiveStep, section: str, k: int, i: int | None,
                    pending: list[tuple[Work, str | None]]) -> Generator[Any, Any, None]:
        if self.rank not in self.engine.groups[st.group]:
            # torch: _warn_not_in_group, and the call returns without communicating
            self.out.warnings.append(
                f"Running {st.op} on global rank {self.rank} which does not belong to the given group."
            )
            return
        value = _fill_value(st.value, self.rank, i)
        numel = 0 if st.op == "barrier" else st.numel
        payload = Payload.full(numel, st.dtype, value)
        root = root_of(st.op, st.root)
        reduce_op = reduce_op_of(st.op, st.reduce_op)
        work = self.dist.issue(st.op, payload, origin=step_origin(st, section, k), group=st.group,
                               reduce_op=reduce_op, root=root, async_op=st.async_op)
        if st.async_op and st.wait == "never":
            return
        if st.async_op and st.wait == "end_of_iteration" and i is not None:
            pending.append((work, st.observe))
            return
        res = yield from work.wait()
        self._observe(st.observe, res)

    def _p2p(self, st: P2PStep, section: str, k: int, i: int | None,
             pending: list[tuple[Work, str | None]]) -> Generator[Any, Any, None]:
        if self.rank not in (st.src, st.dst):
            return
        origin = step_origin(st, section, k)
        if self.rank == st.src:
            payload = Payload.full(st.numel, st.dtype, _fill_value(st.value, self.rank, i))
            work = self.engine.p2p(self.rank, "send", payload, st.dst, tag=st.tag, origin=origin)
            observe = None
        else:
            payload = Payload.full(st.numel, st.dtype, 0.0)
            work = self.engine.p2p(self.rank, "recv", payload, st.src, tag=st.tag, origin=origin)
            observe = st.observe
        if not st.blocking and st.wait == "end_of_iteration" and i is not None:
            pending.append((work, observe))
            return
        res = yield from work.wait()
        self._observe(observe, res)
