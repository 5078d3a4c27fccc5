"""What one rank does, as data: the actions a scenario turns into (see `interpret`).

Each action is what the training script of docs/scenarios.md does at one point, with
everything that follows from the scenario's meaning already decided: conditions applied,
values filled in for this rank and iteration, the root and reduce op kept only where the
op has them, `num_allreduces` resolved, `wait = "end_of_iteration"` turned into "now"
outside the loop, origin labels chosen. A driver only *executes* them: the simulator on
its engine and torch models (`simdist.simrank`), the real backend on torch.distributed
(`real_backend.torchrank`). So the same scenario issues the same calls on both sides by
construction, not by two interpreters agreeing.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Literal

from simdist.schema import Model, Optimizer
from simdist.vocab import WORLD

Wait = Literal["now", "end_of_iteration", "never"]


# --------------------------------------------------------------------------- program structure
@dataclass(frozen=True, slots=True)
class EnterPhase:
    """The rank enters `phase` (vocab.PHASES); `iteration` is the input index in the loop."""

    phase: str
    iteration: int | None = None


@dataclass(frozen=True, slots=True)
class SetupDone:
    """Every object is built; the program proper begins (the real backend syncs start-up here)."""


@dataclass(frozen=True, slots=True)
class EndIteration:
    """The loop body is over for this input: it counts as processed, its loss is dropped."""


@dataclass(frozen=True, slots=True)
class WaitDeferred:
    """Wait, in issue order, on the work deferred with `wait = "end_of_iteration"`, observing it."""


# --------------------------------------------------------------------------- objects
@dataclass(frozen=True, slots=True)
class BuildModel:
    """`DistributedDataParallel(ChainModel(model), process_group=<model.group>, **ddp_kwargs)`,
    named `model.name` (only on the ranks of its group)."""

    model: Model
    ddp_kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class BuildOptimizer:
    """The optimizer over the parameters of `models` (those this rank holds, in order; none:
    one stand-in parameter); `ZeroRedundancyOptimizer` on process group `group` when
    `optimizer.zero`."""

    optimizer: Optimizer
    models: tuple[str, ...] = ()
    group: str = WORLD


@dataclass(frozen=True, slots=True)
class BuildJoinable:
    """A `[[joinables]]` object of `kind` (see torchmodels.registry) on process group `group`."""

    name: str
    kind: str
    group: str


@dataclass(frozen=True, slots=True)
class EnterJoin:
    """`Join(joinables, enable, throw_on_early_termination, **kwargs).__enter__()`."""

    joinables: tuple[str, ...]
    enable: bool
    throw_on_early_termination: bool
    kwargs: dict[str, Any] = field(default_factory=dict)


@dataclass(frozen=True, slots=True)
class ExitJoin:
    """`Join.__exit__` without an exception: shadow the other ranks, then the post hooks."""


# --------------------------------------------------------------------------- steps
@dataclass(frozen=True, slots=True)
class Compute:
    """Busy for `seconds` without communicating (simulated time; wall time for real); this
    rank's own duration when the step gives one per rank."""

    seconds: float


@dataclass(frozen=True, slots=True)
class Forward:
    """`loss[model] = models[model](x).sum()`, inside `no_sync()` when `no_sync`."""

    model: str = "ddp"
    no_sync: bool = False


@dataclass(frozen=True, slots=True)
class Backward:
    """`loss[model].backward()` of this iteration's forward of that model; the backward
    computes for `seconds` (this rank's), each used parameter's gradient ready after its
    share (by element count), so DDP's buckets all-reduce while the rest is computed."""

    model: str = "ddp"
    seconds: float = 0.0


@dataclass(frozen=True, slots=True)
class StepOptimizer:
    """`optimizer.step()` then `optimizer.zero_grad()`."""


@dataclass(frozen=True, slots=True)
class CallJoinable:
    """One call of a `[[joinables]]` object (`num_allreduces` matters to AllReducer only)."""

    name: str
    num_allreduces: int


@dataclass(frozen=True, slots=True)
class Collective:
    """A raw torch.distributed collective of the training loop.

    `value` is every input element, already filled for this rank and iteration (an int for
    "rank"/"iteration", as the real script passes them to `torch.full`). `reduce_op` and
    `root` are None where `op` takes none. `wait` says when the handle is waited
    ("end_of_iteration" only inside the loop); `observe` names the recorded result.
    """

    op: str
    numel: int
    dtype: str
    value: float | int
    reduce_op: str | None
    root: int | None
    group: str
    async_op: bool
    wait: Wait
    observe: str | None
    origin: str


@dataclass(frozen=True, slots=True)
class SkipCollective:
    """A collective on a group this rank is not in: torch warns and returns without
    communicating (`_warn_not_in_group`). `warning` is the text torch prints."""

    call: Collective
    warning: str


@dataclass(frozen=True, slots=True)
class P2P:
    """This rank's side of a send/recv: `op` "send" (to `peer`) or "recv" (from `peer`).

    `value` fills a send's tensor (0 for a receive buffer). `blocking` = send/recv,
    otherwise isend/irecv waited per `wait`. `observe` is set on the receiving side only.
    """

    op: Literal["send", "recv"]
    peer: int
    numel: int
    dtype: str
    value: float | int
    tag: int
    blocking: bool
    wait: Wait
    observe: str | None
    origin: str


@dataclass(frozen=True, slots=True)
class Fail:
    """The script raises `RuntimeError(message)` here (e.g. a backward with no loss to backward)."""

    message: str


Action = (
    EnterPhase | SetupDone | EndIteration | WaitDeferred | BuildModel | BuildOptimizer | BuildJoinable | EnterJoin
    | ExitJoin | Compute | Forward | Backward | StepOptimizer | CallJoinable | Collective | SkipCollective | P2P | Fail
)
