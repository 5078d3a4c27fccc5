"""The scenario file's schema, table by table (docs/scenarios.md): what each may contain.

`simdist.scenario` puts the tables together into a `Scenario`, checks what needs more than
one table (names that resolve, ranks in range) and loads files. A `[[loop]]`/`[[after]]`
step is one thing the training script does (a forward, a raw collective, a send...),
with conditions saying on which ranks and iterations it runs; what a step *does* on a rank
is decided by the interpreter (`simdist.program.interpret`).
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from typing import Annotated, Any, Literal, get_args

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from simdist.limits import INT64_MAX, INT64_MIN, MAX_NUMEL, MAX_TIMEOUT_S, MAX_WORLD_SIZE
from simdist.vocab import WORLD, CollectiveOp, Dtype, ReduceOp

# Integer fields: a count (>= 0), a tensor's element count, any 64-bit integer; what the
# real backend hands torch must fit its C++ types, and nothing needs more.
Count = Annotated[int, Field(ge=0, le=INT64_MAX)]
Numel = Annotated[int, Field(gt=0, le=MAX_NUMEL)]
Int64 = Annotated[int, Field(ge=INT64_MIN, le=INT64_MAX)]
Seconds = Annotated[float, Field(ge=0, le=MAX_TIMEOUT_S, description="at most a day")]


class Strict(BaseModel):
    """Base of every scenario table: unknown keys are errors, and a table never changes.

    Types are strict (pydantic's strict mode): ``world_size = "2"`` or ``counts = [true]``
    is an error, not a silent 2 or 1, since a scenario that means something else than it
    says is worse than one that does not load; a float field still takes an integer.
    inf and nan are rejected everywhere (`simdist.userfiles.check_data` also checks the
    values no field types)."""

    model_config = ConfigDict(extra="forbid", frozen=True, strict=True, allow_inf_nan=False)


# --------------------------------------------------------------------------- topology
class TopoNode(Strict):
    """A host, GPU or switch. Ranks are placed on nodes via `ranks`."""

    name: str
    kind: Literal["host", "gpu", "switch", "nic"] = "host"
    ranks: list[int] = Field(default_factory=list)


class TopoLink(Strict):
    """A bidirectional link; each direction is a FIFO server of this bandwidth."""

    a: str
    b: str
    latency_us: float = Field(ge=0, le=1e9)
    bandwidth_gbps: float = Field(ge=1e-9, le=1e9, description="gigabytes per second")


class Topology(Strict):
    """Either a preset name or explicit nodes and links (not both)."""

    preset: str | None = None
    nodes: list[TopoNode] = Field(default_factory=list)
    links: list[TopoLink] = Field(default_factory=list)
    # Per-collective algorithm choice ("auto" = smallest predicted time, as NCCL's tuner).
    algorithms: dict[str, str] = Field(default_factory=dict)
    # Optional calibrated parameters overriding the preset (seconds, seconds/byte).
    alpha: float | None = Field(default=None, ge=0, le=1e3)
    beta: float | None = Field(default=None, ge=0, le=1.0)
    gamma: float | None = Field(default=None, ge=0, le=1.0)
    # A calibrated timing profile (JSON from `simdist compare-timing --save-profile`).
    profile: str | None = None

    @model_validator(mode="after")
    def _one_kind(self) -> Topology:
        if self.preset is not None and (self.nodes or self.links):
            raise ValueError("give either 'preset' or 'nodes'/'links', not both")
        if self.preset is None and not self.nodes:
            object.__setattr__(self, "preset", "loopback")
        return self


# --------------------------------------------------------------------------- inputs
class Inputs(Strict):
    """Per-rank input counts: an explicit list, or base + offset * rank (torch's tests)."""

    counts: list[Count] | None = Field(default=None, max_length=MAX_WORLD_SIZE)
    base: Count | None = None
    offset: Int64 = 0

    @model_validator(mode="after")
    def _one_form(self) -> Inputs:
        if self.counts is None and self.base is None:
            raise ValueError("give 'counts' or 'base' (and optional 'offset')")
        if self.counts is not None and self.base is not None:
            raise ValueError("give either 'counts' or 'base', not both")
        return self

    def per_rank(self, world_size: int) -> list[int]:
        if self.counts is not None:
            return list(self.counts)
        assert self.base is not None
        return [self.base + self.offset * r for r in range(world_size)]


# --------------------------------------------------------------------------- model / optimizer
class Model(Strict):
    """A DDP-wrapped model, described by its parameter and buffer sizes.

    `params` are element counts in registration order. Backward produces gradients in
    reverse registration order (a chain model), which is the order DDP's reducer sees.
    `[model]` is the model named `ddp` on WORLD; `[[models]]` adds more, each named and on
    its own process group (`DistributedDataParallel(..., process_group=group)`, built only
    on the group's ranks).
    """

    name: str = Field(default="ddp", description="how steps and [join] name it")
    group: str = Field(default=WORLD, description="its process group; only the group's ranks build it")
    params: list[Numel | list[Numel]] = Field(min_length=1)
    dtype: Dtype = "float32"
    buffers: list[Numel] = Field(default_factory=list)
    unused_params: list[int] = Field(default_factory=list, description="indices not used in forward")
    # DDP options (the cap's bytes must fit torch's int64)
    bucket_cap_mb: float | None = Field(default=None, gt=0, le=1e12,
                                        description="None = torch's default (25 MiB, 1 MiB first bucket)")
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    gradient_as_bucket_view: bool = False
    # Record the first parameter's gradient (first element) after every backward as `<name>.grad`.
    observe_grad: bool = False

    @model_validator(mode="after")
    def _check_unused(self) -> Model:
        for k, p in enumerate(self.params):
            if isinstance(p, list) and math.prod(p) > MAX_NUMEL:
                raise ValueError(f"params[{k}]: shape {p} has more than {MAX_NUMEL} elements")
        for i in self.unused_params:
            if not 0 <= i < len(self.params):
                raise ValueError(f"unused_params: index {i} out of range for {len(self.params)} params")
        if self.unused_params and not self.find_unused_parameters:
            raise ValueError(
                "unused_params: needs find_unused_parameters = true (torch raises at the next forward "
                "otherwise; that error is not modelled)"
            )
        return self

    def numels(self) -> list[int]:
        """Element count of each parameter (an int entry is a 1-D parameter, a list is a shape)."""
        return [p if isinstance(p, int) else math.prod(p) for p in self.params]

    def dims(self) -> list[int]:
        return [1 if isinstance(p, int) else len(p) for p in self.params]


class Optimizer(Strict):
    """The optimizer stepped by `optimizer_step`; `zero = true` wraps it in ZeroRedundancyOptimizer.

    It optimises the parameters of `models` (default: every model) that the rank holds.
    ZeRO shards them over `group` (default: the group its models share), and only that
    group's ranks build it."""

    kind: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.01
    zero: bool = False
    models: list[str] | None = Field(default=None, min_length=1, description="whose parameters (default: every model)")
    group: str | None = Field(default=None, description="ZeRO's process group (default: its models' group)")


class JoinableDecl(Strict):
    """A custom joinable: a kind of the joinable registry (`simdist.torchmodels.registry`)."""

    name: str
    kind: str = Field(description="counter | allreducer | a kind registered with register_joinable")
    group: str = WORLD

    @field_validator("kind")
    @classmethod
    def _known_kind(cls, kind: str) -> str:
        # Imported here, not at the top: the registry names the simulator's classes (and so
        # loads the engine), which only a scenario that declares joinables needs.
        from simdist.torchmodels.registry import kinds_for

        if kind not in kinds_for("sim"):
            raise ValueError(f"unknown joinable kind '{kind}' (known: {', '.join(kinds_for('sim'))})")
        return kind


class JoinBlock(Strict):
    """Wraps the loop in `Join(joinables, enable, throw_on_early_termination, **kwargs)`."""

    enabled: bool = True
    joinables: list[str] = Field(min_length=1)
    throw_on_early_termination: bool = False
    kwargs: dict[str, bool | int | float | str] = Field(default_factory=dict)


class Group(Strict):
    """A sub-group created on every rank with `dist.new_group(ranks)`."""

    name: str
    ranks: list[int] = Field(min_length=1, max_length=MAX_WORLD_SIZE)


class Expect(Strict):
    """What the run must produce; `simdist run` exits 0 only when all of it holds."""

    outcome: Literal["completed", "hang", "error"] | None = None
    inputs_processed: list[int] | None = None
    status: list[Literal["completed", "error", "hang", "aborted"]] | None = None
    # rank (as string) -> substring of the error message, e.g. {"0" = "exhausted all inputs"}
    errors: dict[str, str] = Field(default_factory=dict)
    # observed name -> per-rank value (list indexed by rank)
    observed: dict[str, list[Any]] = Field(default_factory=dict)
    # rank (as string) -> list of collectives issued count (len of trace)
    collectives: list[int] | None = None


# --------------------------------------------------------------------------- conditions
class When(Strict):
    """A condition on rank r and iteration i (0-based), written as data: it holds when every
    key given holds. `not` and `any` nest conditions, so offsets, negations and ranges
    combine without any user text being evaluated. The interpreter decides what a condition
    means at run time (`simdist.program.conditions`)."""

    every: int | None = Field(default=None, ge=1, le=INT64_MAX, description="only when i % every == offset")
    offset: Count | None = Field(default=None, description="with every: only when i % every == offset (default 0)")
    below: Count | None = Field(default=None, description="only for iterations i < below")
    from_iteration: Count | None = Field(default=None, description="only for i >= from_iteration")
    ranks: list[int] | None = Field(default=None, description="only on these ranks")
    not_: When | None = Field(default=None, alias="not", description="only when this condition does not hold")
    any_: list[When] | None = Field(default=None, alias="any", min_length=1,
                                    description="only when at least one of these conditions holds")
    flag: str | None = Field(default=None, description="only when the latest result this rank observed under "
                                                       "this name (a step's observe) is nonzero")

    model_config = ConfigDict(populate_by_name=True)  # merged with Strict's

    @model_validator(mode="after")
    def _offset_below_every(self) -> When:
        if self.offset is not None and self.every is None:
            raise ValueError("offset: needs every (i % every == offset)")
        if self.offset is not None and self.every is not None and self.offset >= self.every:
            raise ValueError(f"offset: must be below every ({self.every}), got {self.offset}")
        return self

    def parts(self) -> Iterator[When]:
        """This condition and every condition nested in it (`not`, `any`), depth first."""
        yield self
        for c in ([self.not_] if self.not_ is not None else []) + list(self.any_ or []):
            yield from c.parts()

    def uses_iteration(self) -> bool:
        """Whether the condition looks at the iteration (meaningless after the loop)."""
        return any(c.every is not None or c.below is not None or c.from_iteration is not None for c in self.parts())


ScalarValue = float | Literal["rank", "iteration"]


class ValueWhen(Strict):
    """A value that depends on a condition: `then` where `when` holds, else `else` (e.g. a
    per-rank "I want to stop" flag for an all-reduced stop decision)."""

    when: When
    then: ScalarValue = 1.0
    else_: ScalarValue = Field(default=0.0, alias="else")

    model_config = ConfigDict(populate_by_name=True)  # merged with Strict's


Value = ScalarValue | ValueWhen


# --------------------------------------------------------------------------- steps
class _Cond(When):
    """Conditions shared by every step: it runs on iteration i of rank r only when all the
    keys of `When` it carries hold (docs/scenarios.md, Conditions)."""


class ComputeStep(_Cond):
    """Busy without communicating: one duration, or one per rank (stragglers)."""

    kind: Literal["compute"]
    seconds: Seconds | list[Seconds]


class ForwardStep(_Cond):
    """DDP forward (`_pre_forward` collectives). `no_sync` = inside `model.no_sync()`."""

    kind: Literal["forward"]
    no_sync: bool = False
    model: str | None = Field(default=None, description="which DDP model (default: the only one)")


class BackwardStep(_Cond):
    """DDP backward: gradient bucket all-reduces from the reducer, overlapping the backward's
    own compute (`seconds`) when it has any."""

    kind: Literal["backward"]
    model: str | None = Field(default=None, description="which DDP model (default: the only one)")
    seconds: Seconds | list[Seconds] = Field(
        default=0.0, description="the backward's compute, shared among the used parameters by size (real: sleeps); "
                                 "one duration, or one per rank")


class OptimizerStep(_Cond):
    kind: Literal["optimizer_step"]


class JoinableCallStep(_Cond):
    """Calls a custom joinable once (Counter.__call__ / AllReducer.__call__)."""

    kind: Literal["joinable_call"]
    joinable: str
    num_allreduces: Count | None = Field(default=None, description="AllReducer: default [join].kwargs.num_allreduces or 1")


class CollectiveStep(_Cond):
    """A raw torch.distributed collective issued by the training loop.

    `value` is what every element of the input holds: a number, or "rank" (the global
    rank), or "iteration" (the 0-based input index). `observe` names the result so it
    appears in the rank's observed values (appended once per execution).
    """

    kind: Literal["collective"]
    op: CollectiveOp
    numel: int = Field(default=1, ge=0, le=MAX_NUMEL)
    dtype: Dtype = "float32"
    reduce_op: ReduceOp = "sum"
    root: Count = Field(default=0, description="global rank: broadcast src / reduce dst / gather dst / scatter src")
    group: str = WORLD
    async_op: bool = Field(default=False, alias="async")
    wait: Literal["now", "end_of_iteration", "never"] = "now"
    value: Value = 1.0
    observe: str | None = None
    name: str | None = None

    model_config = ConfigDict(populate_by_name=True)  # merged with Strict's


class P2PStep(_Cond):
    """Point-to-point: `src` sends `numel` elements to `dst`; other ranks skip the step.

    `blocking = false` uses isend/irecv (waited at once, or at end of iteration with
    `wait = "end_of_iteration"`).
    """

    kind: Literal["p2p"]
    src: Count
    dst: Count
    numel: Numel = 1
    dtype: Dtype = "float32"
    tag: int = Field(default=0, ge=-(1 << 31), le=(1 << 31) - 1, description="a C int in torch")
    blocking: bool = True
    wait: Literal["now", "end_of_iteration"] = "now"
    value: Value = "rank"
    observe: str | None = None


class SleepStep(_Cond):
    """Stay alive for a while without communicating (wall time on the real backend)."""

    kind: Literal["sleep"]
    seconds: Seconds | list[Seconds]


class StopStep(_Cond):
    """`break`: leave the loop here, on the iterations and ranks where its conditions hold.

    The rest of the iteration does not run and it does not count as processed; the work
    deferred to the end of the iteration is still waited; then the Join block exits and
    the `after` steps run, as after the last input."""

    kind: Literal["stop"]


class RaiseStep(_Cond):
    """The script raises ``RuntimeError(message)`` here and its program ends: a rank that failed
    with that error (a replay of Flight Recorder dumps writes one where a rank's error file was)."""

    kind: Literal["raise"]
    message: str = Field(min_length=1)


Step = Annotated[
    ComputeStep
    | ForwardStep
    | BackwardStep
    | OptimizerStep
    | JoinableCallStep
    | CollectiveStep
    | P2PStep
    | SleepStep
    | StopStep
    | RaiseStep,
    Field(discriminator="kind"),
]
# The `kind` tag of every step class (pydantic puts it into error locations).
STEP_KINDS: tuple[str, ...] = tuple(get_args(c.model_fields["kind"].annotation)[0] for c in get_args(get_args(Step)[0]))

