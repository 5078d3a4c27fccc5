"""The scenario interpreter: one rank's training script as a sequence of actions.

docs/scenarios.md defines the script every rank runs: build the DDP models, the optimizer
and the custom joinables it holds, then `with Join(...)` (or no context) run the loop steps
for each of this rank's inputs (until a `stop` step breaks out), then the `after` steps. `rank_actions` is that script, written once:
the simulator (`simdist.simrank`) and the real backend (`real_backend.torchrank`) each only
execute what it yields. Pure Python: no torch, no simpy, no clock.

An action that fails ends the rank's program: the driver stops iterating (a `Join` left by
an exception does nothing, in torch and in the model alike).
"""

from __future__ import annotations

import functools
from collections.abc import Generator, Iterator
from dataclasses import dataclass
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
from simdist.program.conditions import Latest, always, fill_value, holds, no_results, varies
from simdist.program.shapes import ShapeMemo
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
    StopStep,
)
from simdist.vocab import OPS, WORLD, reduce_op_of, root_of


def rank_actions(s: Scenario, rank: int, latest: Latest = no_results) -> Iterator[Action]:
    """Everything rank `rank` does in scenario `s`, in program order; a `Fail` is the last.

    `latest(name)` is the latest result the rank observed under `name` (what a `flag`
    condition reads): the driver records results as it executes the actions, and this
    generator looks at a condition only when the driver asks for the step's action, after
    executing every action before it."""
    for action in _program(s, rank, latest):
        yield action
        if type(action) is Fail:
            return


@dataclass(frozen=True)
class _Held:
    """The objects this rank builds: a model, ZeRO or a custom joinable on a process group
    exists only on that group's ranks (the script does `if rank in group_ranks: ...`)."""

    names: frozenset[str]  # models, custom joinables, and "zero" when this rank builds ZeRO
    optimizer: bool


def _held(s: Scenario, rank: int) -> _Held:
    names = {m.name for m in s.all_models() if rank in s.group_ranks(m.group)}
    names |= {j.name for j in s.joinables if rank in s.group_ranks(j.group)}
    optimizer = s.optimizer is not None and (not s.optimizer.zero or rank in s.group_ranks(s.zero_group()))
    if optimizer and s.optimizer is not None and s.optimizer.zero:
        names.add("zero")
    return _Held(frozenset(names), optimizer)


def _program(s: Scenario, rank: int, latest: Latest) -> Iterator[Action]:
    st = _static(s, rank)
    yield from st.setup
    if st.enter_join is not None:  # (None without [join], or holding none of its joinables)
        yield st.enter_join
    loop = st.loop
    count = s.counts()[rank]
    body = st.same_body(s, rank) if count else None
    made: dict[int, Action | None] = {}  # a step's action, when the same in every iteration
    for i in range(count):
        yield _enter_loop(i)
        if body is not None:
            yield from body
        else:
            stopped = yield from _section(s, rank, "loop", i, made, st.held, latest, loop)
            if stopped:
                break
        yield _END_ITERATION
    if st.enter_join is not None:
        yield EnterPhase("join_exit")
        yield ExitJoin()
    yield EnterPhase("after")
    yield from _section(s, rank, "after", None, {}, st.held, latest, st.after)


_UNKNOWN: Any = object()


@dataclass(slots=True)
class _Static:
    """What one rank's program is apart from its input count and the results it observes:
    worked out once per rank and scenario shape (`_static`), not once per run. The fuzzer
    simulates thousands of scenarios that differ in their inputs only; working this out
    again for every rank of every run was most of the interpreter's cost there."""

    held: _Held
    setup: tuple[Action, ...]  # EnterPhase("init") ... SetupDone
    enter_join: EnterJoin | None  # None: the rank runs its loop without Join
    loop: tuple[_Entry, ...]
    after: tuple[_Entry, ...]
    body: Any = _UNKNOWN  # `_same_every_iteration`'s answer, once asked

    def same_body(self, s: Scenario, rank: int) -> tuple[Action, ...] | None:
        if self.body is _UNKNOWN:
            self.body = _same_every_iteration(s, rank, {}, self.held, self.loop)
        return self.body


def _make_static(s: Scenario, rank: int) -> _Static:
    held = _held(s, rank)
    setup: list[Action] = [EnterPhase("init")]
    for m in s.all_models():
        if m.name in held.names:
            setup.append(BuildModel(m, ddp_kwargs(m)))
    if s.optimizer is not None and held.optimizer:
        mine = tuple(m.name for m in s.optimizer_models() if m.name in held.names)
        setup.append(BuildOptimizer(s.optimizer, mine, s.zero_group() if s.optimizer.zero else WORLD))
    for decl in s.joinables:
        if decl.name in held.names:
            setup.append(BuildJoinable(decl.name, decl.kind, decl.group))
    setup.append(SetupDone())
    # a rank enters Join with the joinables it holds; holding none, it runs the loop without Join
    joined = tuple(n for n in s.join.joinables if n in held.names) if s.join is not None else ()
    enter = EnterJoin(joined, s.join.enabled, s.join.throw_on_early_termination, dict(s.join.kwargs)) \
        if s.join is not None and joined else None
    return _Static(held, tuple(setup), enter, _entries(s, "loop"), _entries(s, "after"))


_STATICS = ShapeMemo()


def _static(s: Scenario, rank: int) -> _Static:
    """`_make_static(s, rank)`, once per rank and scenario shape (`shapes.ShapeMemo`)."""
    return _STATICS.get(s, rank, lambda: _make_static(s, rank))


_END_ITERATION = EndIteration()
_WAIT_DEFERRED = WaitDeferred()


@functools.lru_cache(maxsize=4096)
def _enter_loop(i: int) -> EnterPhase:
    """`EnterPhase("loop", i)`, made once (actions are frozen: every rank and run can share it)."""
    return EnterPhase("loop", i)


def _same_every_iteration(s: Scenario, rank: int, made: dict[int, Action | None], held: _Held,
                          entries: tuple[_Entry, ...]) -> tuple[Action, ...] | None:
    """The loop body's actions when they are the same in every iteration, else None.

    They are when no step has a condition (`_Entry.always`: no iteration, rank or flag
    test) and every step's action is the same in every iteration (`_Entry.const`), and no
    step is a `stop`: then `_section` takes the same path each time (which forwards have a
    loss to backward included), reads no result (`latest`), and yields the same actions. A
    pass that fails (a `Fail`) is left to `_section`, which ends the program there. Worked
    out once per rank: the body is then a tuple, not a pass over the steps every iteration."""
    if not all(e.always and e.const and not e.stop for e in entries):
        return None
    actions = tuple(_section(s, rank, "loop", 0, made, held, no_results, entries))
    return None if any(type(a) is Fail for a in actions) else actions


@dataclass(slots=True)  # (not frozen: a frozen dataclass's __init__ costs a setattr call per field)
class _Entry:
    """What a step of a section is, as far as it does not change between iterations: read
    once per rank, not per step and iteration (a pydantic attribute miss for `value` and
    `model_named`'s scan of the models were among the interpreter's costliest lines)."""

    k: int
    step: Step
    stop: bool
    pass_: int  # 0: neither, 1: a forward, 2: a backward (of model `model`)
    model: str
    const: bool  # the step's action is the same in every iteration (kept in `made`)
    always: bool  # the step has no condition (`conditions.always`): `holds` need not be asked


def _entries(s: Scenario, section: str) -> tuple[_Entry, ...]:
    out = []
    for k, step in enumerate(s.loop if section == "loop" else s.after):
        fb = isinstance(step, (ForwardStep, BackwardStep))
        out.append(_Entry(k, step, isinstance(step, StopStep), (1 if isinstance(step, ForwardStep) else 2) if fb else 0,
                          s.model_named(step.model).name if fb else "",  # type: ignore[union-attr]
                          "value" not in type(step).model_fields or not varies(step.value),  # type: ignore[union-attr]
                          always(step)))
    return tuple(out)


def _section(s: Scenario, rank: int, section: str, i: int | None, made: dict[int, Action | None], held: _Held,
             latest: Latest, entries: tuple[_Entry, ...]) -> Generator[Action, None, bool]:
    """One pass over `loop` (iteration i) or `after` (i None), then the deferred waits;
    returns True when a `stop` step ended the pass (the loop is left). `entries`: the
    section's `_entries`.

    A loss lives from a model's forward to the backward that consumes it, within one pass:
    it is never carried into the next iteration (the real script drops it there)."""
    losses: set[str] = set()
    for e in entries:
        step, k = e.step, e.k
        if not e.always and not holds(step, rank, i, latest):
            continue
        if e.stop:
            yield _WAIT_DEFERRED  # the iteration's deferred work is still waited (docs/scenarios.md)
            return True
        if e.pass_:
            name = e.model
            if name not in held.names:
                continue
            if e.pass_ == 1:
                losses.add(name)
            elif name not in losses:
                # no loss to backward: torch would refuse a graph the last backward freed
                yield Fail(f"{section}[{k}]: backward without a forward earlier in this iteration")
                return True
            else:
                losses.discard(name)
        if k in made:
            action = made[k]
        else:
            action = _step(s, rank, step, f"{section}[{k}]", i, held, latest)
            if e.const:
                made[k] = action
        if action is not None:
            yield action
    yield _WAIT_DEFERRED
    return False


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


def not_in_group_warning(op: str, rank: int) -> str:
    """torch's `_warn_not_in_group` text for a scenario op issued on a group without `rank`."""
    return f"Running {OPS[op].function} on global rank {rank} which does not belong to the given group."


def _wait(wait: Wait, i: int | None) -> Wait:
    """`end_of_iteration` outside the loop means at once (docs/scenarios.md)."""
    return "now" if wait == "end_of_iteration" and i is None else wait


def _step(s: Scenario, rank: int, step: Step, where: str, i: int | None, held: _Held,
          latest: Latest) -> Action | None:
    """What `step` does on this rank and iteration (None: nothing, e.g. a p2p between others,
    an optimizer or joinable this rank does not hold)."""
    if isinstance(step, (ComputeStep, SleepStep)):
        return Compute(step.seconds[rank] if isinstance(step.seconds, list) else step.seconds)
    if isinstance(step, ForwardStep):
        return Forward(s.model_named(step.model).name, step.no_sync)
    if isinstance(step, BackwardStep):
        return Backward(s.model_named(step.model).name,
                        step.seconds[rank] if isinstance(step.seconds, list) else step.seconds)
    if isinstance(step, OptimizerStep):
        return StepOptimizer() if held.optimizer else None
    if isinstance(step, JoinableCallStep):
        if step.joinable not in held.names:
            return None
        n = step.num_allreduces
        if n is None:
            n = int(s.join.kwargs.get("num_allreduces", 1)) if s.join is not None else 1
        return CallJoinable(step.joinable, n)
    if isinstance(step, CollectiveStep):
        return _collective(s, rank, step, where, i, latest)
    if isinstance(step, P2PStep):
        return _p2p(rank, step, where, i, latest) if rank in (step.src, step.dst) else None
    if isinstance(step, RaiseStep):
        return Fail(step.message)
    raise AssertionError(step)  # pragma: no cover - the scenario schema admits no other kind


def _collective(s: Scenario, rank: int, st: CollectiveStep, where: str, i: int | None,
                latest: Latest) -> Collective | SkipCollective:
    call = Collective(
        op=st.op,
        numel=0 if st.op == "barrier" else st.numel,
        dtype=st.dtype,
        value=fill_value(st.value, rank, i, latest),
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


def _p2p(rank: int, st: P2PStep, where: str, i: int | None, latest: Latest) -> P2P:
    sending = rank == st.src
    return P2P(
        op="send" if sending else "recv",
        peer=st.dst if sending else st.src,
        numel=st.numel,
        dtype=st.dtype,
        value=fill_value(st.value, rank, i, latest) if sending else 0,
        tag=st.tag,
        blocking=st.blocking,
        wait="now" if st.blocking else _wait(st.wait, i),
        observe=None if sending else st.observe,
        origin=step_origin(st, where),
    )
