"""The scenario interpreter: one rank's training script as a sequence of actions.

docs/scenarios.md defines the script every rank runs: build the DDP model, the optimizer
and the custom joinables, then `with Join(...)` (or no context) run the loop steps for each
of this rank's inputs, then the `after` steps. `rank_actions` is that script, written once:
the simulator (`simdist.simrank`) and the real backend (`real_backend.torchrank`) each only
execute what it yields. Pure Python: no torch, no simpy, no clock.

An action that fails ends the rank's program: the driver stops iterating (a `Join` left by
an exception does nothing, in torch and in the model alike).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

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
    Wait,
    WaitDeferred,
)
from simdist.scenario import Model, Scenario
from simdist.schema import (
    BackwardStep,
    CollectiveStep,
    ComputeStep,
    ForwardStep,
    JoinableCallStep,
    OptimizerStep,
    P2PStep,
    RaiseStep,
    SleepStep,
    Step,
)
from simdist.vocab import OPS, reduce_op_of, root_of


def rank_actions(s: Scenario, rank: int) -> Iterator[Action]:
    """Everything rank `rank` does in scenario `s`, in program order; a `Fail` is the last."""
    for action in _program(s, rank):
        yield action
        if type(action) is Fail:
            return


def _program(s: Scenario, rank: int) -> Iterator[Action]:
    yield EnterPhase("init")
    if s.model is not None:
        yield BuildModel(s.model, ddp_kwargs(s.model))
    if s.optimizer is not None:
        yield BuildOptimizer(s.optimizer)
    for decl in s.joinables:
        yield BuildJoinable(decl.name, decl.kind, decl.group)
    yield SetupDone()
    if s.join is not None:
        yield EnterJoin(tuple(s.join.joinables), s.join.enabled, s.join.throw_on_early_termination, dict(s.join.kwargs))
    made: dict[int, Action | None] = {}  # a step's action, when the same in every iteration
    for i in range(s.counts()[rank]):
        yield EnterPhase("loop", i)
        yield from _section(s, rank, "loop", i, made)
        yield _END_ITERATION
    if s.join is not None:
        yield EnterPhase("join_exit")
        yield ExitJoin()
    yield EnterPhase("after")
    yield from _section(s, rank, "after", None, {})


_END_ITERATION = EndIteration()
_WAIT_DEFERRED = WaitDeferred()


def _section(s: Scenario, rank: int, section: str, i: int | None, made: dict[int, Action | None]) -> Iterator[Action]:
    """One pass over `loop` (iteration i) or `after` (i None), then the deferred waits.

    A loss lives from a forward to the backward that consumes it, within one pass: it is
    never carried into the next iteration (the real script drops it there)."""
    loss = False
    for k, step in enumerate(s.loop if section == "loop" else s.after):
        if not step.applies(rank, i):
            continue
        if isinstance(step, ForwardStep):
            loss = True
        elif isinstance(step, BackwardStep):
            if not loss:
                # no loss to backward: torch would refuse a graph the last backward freed
                yield Fail(f"{section}[{k}]: backward without a forward earlier in this iteration")
                return
            loss = False
        if k in made:
            action = made[k]
        else:
            action = _step(s, rank, step, f"{section}[{k}]", i)
            if getattr(step, "value", None) != "iteration":
                made[k] = action
        if action is not None:
            yield action
    yield _WAIT_DEFERRED


def ddp_kwargs(m: Model) -> dict[str, Any]:
    """The keyword arguments the script gives DistributedDataParallel: the `[model]` table's
    options, with `broadcast_buffers` passed only when false and `bucket_cap_mb` only when
    set (torch's defaults otherwise; torch 2.13 warns that `broadcast_buffers` is deprecated
    whenever it is passed)."""
    kwargs: dict[str, Any] = {"find_unused_parameters": m.find_unused_parameters,
                              "gradient_as_bucket_view": m.gradient_as_bucket_view}
    if not m.broadcast_buffers:
        kwargs["broadcast_buffers"] = False
    if m.bucket_cap_mb is not None:
        kwargs["bucket_cap_mb"] = m.bucket_cap_mb
    return kwargs


def step_origin(step: Step, where: str) -> str:
    """Origin label of a user step: `user.<name>`, or `user.<section>[<index>]` without a name."""
    name = getattr(step, "name", None)
    return f"user.{name}" if name else f"user.{where}"


def fill_value(value: float | str, rank: int, i: int | None) -> float | int:
    """A step's `value` on this rank and iteration ("iteration" is -1 outside the loop)."""
    if value == "rank":
        return rank
    if value == "iteration":
        return -1 if i is None else i
    return float(value)


def not_in_group_warning(op: str, rank: int) -> str:
    """torch's `_warn_not_in_group` text for a scenario op issued on a group without `rank`."""
    return f"Running {OPS[op].function} on global rank {rank} which does not belong to the given group."


def _wait(wait: Wait, i: int | None) -> Wait:
    """`end_of_iteration` outside the loop means at once (docs/scenarios.md)."""
    return "now" if wait == "end_of_iteration" and i is None else wait


def _step(s: Scenario, rank: int, step: Step, where: str, i: int | None) -> Action | None:
    """What `step` does on this rank and iteration (None: nothing, e.g. a p2p between others)."""
    if isinstance(step, (ComputeStep, SleepStep)):
        return Compute(step.seconds)
    if isinstance(step, ForwardStep):
        return Forward(step.no_sync)
    if isinstance(step, BackwardStep):
        return Backward()
    if isinstance(step, OptimizerStep):
        return StepOptimizer()
    if isinstance(step, JoinableCallStep):
        n = step.num_allreduces
        if n is None:
            n = int(s.join.kwargs.get("num_allreduces", 1)) if s.join is not None else 1
        return CallJoinable(step.joinable, n)
    if isinstance(step, CollectiveStep):
        return _collective(s, rank, step, where, i)
    if isinstance(step, P2PStep):
        return _p2p(rank, step, where, i) if rank in (step.src, step.dst) else None
    if isinstance(step, RaiseStep):
        return Fail(step.message)
    raise AssertionError(step)  # pragma: no cover - the scenario schema admits no other kind


def _collective(s: Scenario, rank: int, st: CollectiveStep, where: str, i: int | None) -> Collective | SkipCollective:
    call = Collective(
        op=st.op,
        numel=0 if st.op == "barrier" else st.numel,
        dtype=st.dtype,
        value=fill_value(st.value, rank, i),
        reduce_op=reduce_op_of(st.op, st.reduce_op),
        root=root_of(st.op, st.root),
        group=st.group,
        async_op=st.async_op,
        wait=_wait(st.wait, i) if st.async_op else "now",
        observe=st.observe,
        origin=step_origin(st, where),
    )
    if rank not in s.group_ranks(st.group):
        return SkipCollective(call, not_in_group_warning(st.op, rank))
    return call


def _p2p(rank: int, st: P2PStep, where: str, i: int | None) -> P2P:
    sending = rank == st.src
    return P2P(
        op="send" if sending else "recv",
        peer=st.dst if sending else st.src,
        numel=st.numel,
        dtype=st.dtype,
        value=fill_value(st.value, rank, i) if sending else 0,
        tag=st.tag,
        blocking=st.blocking,
        wait="now" if st.blocking else _wait(st.wait, i),
        observe=None if sending else st.observe,
        origin=step_origin(st, where),
    )
