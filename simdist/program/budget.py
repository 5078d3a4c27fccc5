"""How much work a scenario's program may do, known before it runs: the `ops` limit.

A run's cost (time, events, trace entries, report size) grows with the operations its
ranks perform: collectives and p2p calls, compute and sleep steps, loop iterations. The
interpreter (`simdist.program.interpret`) and the models decide them one by one while the
run goes on, so they are not known in advance; an *upper bound* is, and that is what
`check_ops` compares with `limits.OPS` before any work starts. The bound is generous where
the models are intricate (every DDP parameter its own bucket, every rank shadowing every
iteration under Join), so a scenario near the limit may do much less than its bound; the
engine also counts the trace entries it records against the same limit (a backstop).
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.limits import OPS
from simdist.program.shapes import ShapeMemo
from simdist.scenario import Scenario
from simdist.schema import (
    BackwardStep,
    ForwardStep,
    JoinableCallStep,
    OptimizerStep,
    Step,
)


@dataclass(frozen=True)
class Budget:
    """The upper bound, with how it was reached (for the error message)."""

    total: int
    ranks: int
    iterations: int  # the longest rank's inputs: under Join every rank may shadow them all
    per_iteration: int
    fixed: int  # per rank, outside the loop: set-up, Join's exit, the `after` steps

    def explain(self) -> str:
        return (f"{self.ranks} rank(s) x ({self.iterations:,} iteration(s) x {self.per_iteration:,} + "
                f"{self.fixed:,}) operations")


def _sizes(s: Scenario, model: str | None = None) -> tuple[int, int]:
    """(parameters, buffers) of the DDP model named `model`; of every model together when
    None (ZeRO over all of them, Join's hooks, set-up: a bound over all the models)."""
    models = s.all_models()
    if model is not None and models:
        models = [s.model_named(model)]
    return sum(len(m.params) for m in models), sum(len(m.buffers) for m in models)


def _notify(s: Scenario) -> int:
    """Join.notify_join_context: a heartbeat all-reduce, and one more to check for throws."""
    return 0 if s.join is None else 1 + int(s.join.throw_on_early_termination)


def _allreduces(s: Scenario) -> int:
    n = s.join.kwargs.get("num_allreduces", 1) if s.join is not None else 1
    return n if isinstance(n, int) and not isinstance(n, bool) else 1


def step_ops(s: Scenario, st: Step) -> int:
    """At most how many operations one execution of `st` performs on one rank."""
    params, buffers = _sizes(s, st.model) if isinstance(st, (ForwardStep, BackwardStep)) else _sizes(s)
    if isinstance(st, ForwardStep):  # DDP _pre_forward: common rank, buffers, backward-sync flag
        return 2 + buffers + _notify(s)
    if isinstance(st, BackwardStep):  # one bucket per parameter at most, the unused-map all-reduce
        return params + 1
    if isinstance(st, OptimizerStep):  # ZeRO: one broadcast per parameter
        return params + 1 + _notify(s)
    if isinstance(st, JoinableCallStep):
        n = st.num_allreduces if st.num_allreduces is not None else _allreduces(s)
        return 1 + n + _notify(s)
    return 1  # a collective, a p2p call, compute, sleep


def _shadow_ops(s: Scenario) -> int:
    """A rank out of inputs under Join, per iteration it shadows: Join's count all-reduce
    and every joinable's main hook."""
    if s.join is None:
        return 0
    params, buffers = _sizes(s)
    ops = 1
    for name in s.join.joinables:
        kind = s.joinable_kind(name)
        if kind == "ddp":
            p, b = _sizes(s, name)
            ops += 5 + p + b
        else:
            ops += {"zero": params, "allreducer": _allreduces(s)}.get(kind, 1)
    return ops


def _fixed_ops(s: Scenario) -> int:
    """Per rank, outside the loop: set-up (DDP's construction and its one bucket rebuild),
    Join's exit and post hooks, the `after` steps."""
    params, buffers = _sizes(s)
    ops = 2 + len(s.joinables) + sum(step_ops(s, st) for st in s.after)
    models = len(s.all_models())
    ops += 4 * models + 2 * params + buffers  # per model: verify, sync states; rebuild_buckets broadcasts
    if s.join is not None:
        ops += 2 + 2 * len(s.join.joinables) + params + buffers
    return ops


_PER_SHAPE = ShapeMemo()  # (per iteration, fixed): neither reads the inputs


def estimate(s: Scenario) -> Budget:
    """The upper bound on the operations of a run of `s`."""
    iterations = max(s.counts(), default=0)
    per_iteration, fixed = _PER_SHAPE.get(s, "budget", lambda: (
        1 + max(sum(step_ops(s, st) for st in s.loop), _shadow_ops(s)), _fixed_ops(s)))
    total = s.world_size * (iterations * per_iteration + fixed)
    return Budget(total, s.world_size, iterations, per_iteration, fixed)


def check_ops(s: Scenario, source: str | None = None) -> Budget:
    """Raise LimitError (naming `source`, the inputs and `limits.OPS`) when a run of `s` may
    perform more operations than the limit allows; else the budget."""
    b = estimate(s)
    OPS.check(b.total, f"{source or s.name}: inputs", f"a run may perform up to {b.total:,} operations "
                                                       f"({b.explain()})")
    return b
