"""The scenario: one validated description of a distributed training loop.

A single `Scenario` feeds both the simulator and the real backend, so everything either
side needs to reproduce a run lives here, and nothing else does. Files are TOML; the
same model can be built from Python (`Scenario.model_validate(dict)` or the classes).

Validation is strict (unknown keys are errors) and every error names the offending field
as a dotted path, e.g. ``loop[2].group: unknown group 'evens'``, because users edit these
files by hand and a traceback tells them nothing.

See docs/scenarios.md for the full reference with a worked example.
"""

from __future__ import annotations

from pathlib import Path
from typing import Annotated, Any, Literal

import tomllib
from pydantic import BaseModel, ConfigDict, Field, ValidationError, model_validator

from simdist.errors import ScenarioError
from simdist.vocab import BITWISE_REDUCE_OPS, ROOTED_OPS, WORLD, CollectiveOp, Dtype, ReduceOp


class _Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", frozen=True)


# --------------------------------------------------------------------------- topology
class TopoNode(_Strict):
    """A host, GPU or switch. Ranks are placed on nodes via `ranks`."""

    name: str
    kind: Literal["host", "gpu", "switch", "nic"] = "host"
    ranks: list[int] = Field(default_factory=list)


class TopoLink(_Strict):
    """A bidirectional link; each direction is a FIFO server of this bandwidth."""

    a: str
    b: str
    latency_us: float = Field(ge=0)
    bandwidth_gbps: float = Field(gt=0, description="gigabytes per second")


class Topology(_Strict):
    """Either a preset name or explicit nodes and links (not both)."""

    preset: str | None = None
    nodes: list[TopoNode] = Field(default_factory=list)
    links: list[TopoLink] = Field(default_factory=list)
    # Per-collective algorithm choice ("auto" = smallest predicted time, as NCCL's tuner).
    algorithms: dict[str, str] = Field(default_factory=dict)
    # Optional calibrated parameters overriding the preset (seconds, seconds/byte).
    alpha: float | None = Field(default=None, ge=0)
    beta: float | None = Field(default=None, ge=0)
    gamma: float | None = Field(default=None, ge=0)
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
class Inputs(_Strict):
    """Per-rank input counts: an explicit list, or base + offset * rank (torch's tests)."""

    counts: list[Annotated[int, Field(ge=0)]] | None = None
    base: int | None = Field(default=None, ge=0)
    offset: int = 0

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
class Model(_Strict):
    """The DDP-wrapped model, described by its parameter and buffer sizes.

    `params` are element counts in registration order. Backward produces gradients in
    reverse registration order (a chain model), which is the order DDP's reducer sees.
    """

    params: list[Annotated[int, Field(gt=0)] | list[Annotated[int, Field(gt=0)]]] = Field(min_length=1)
    dtype: Dtype = "float32"
    buffers: list[Annotated[int, Field(gt=0)]] = Field(default_factory=list)
    unused_params: list[int] = Field(default_factory=list, description="indices not used in forward")
    # DDP options
    bucket_cap_mb: float | None = Field(default=None, gt=0, description="None = torch's default (25 MiB, 1 MiB first bucket)")
    find_unused_parameters: bool = False
    broadcast_buffers: bool = True
    gradient_as_bucket_view: bool = False
    # Record the first parameter's gradient (first element) after every backward as `ddp.grad`.
    observe_grad: bool = False

    @model_validator(mode="after")
    def _check_unused(self) -> Model:
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
        return [p if isinstance(p, int) else _prod(p) for p in self.params]

    def dims(self) -> list[int]:
        return [1 if isinstance(p, int) else len(p) for p in self.params]


def _prod(xs: list[int]) -> int:
    out = 1
    for x in xs:
        out *= x
    return out


class Optimizer(_Strict):
    """The optimizer stepped by `optimizer_step`; `zero = true` wraps it in ZeroRedundancyOptimizer."""

    kind: Literal["sgd", "adam"] = "sgd"
    lr: float = 0.01
    zero: bool = False


class JoinableDecl(_Strict):
    """A custom joinable: the tutorial `Counter` or torch's test `AllReducer`."""

    name: str
    kind: str = Field(description="counter | allreducer | a kind registered with register_joinable")
    group: str = WORLD

    @model_validator(mode="after")
    def _known_kind(self) -> JoinableDecl:
        from simdist.torchmodels.registry import JOINABLE_KINDS

        if self.kind not in JOINABLE_KINDS:
            raise ValueError(f"kind: unknown joinable kind '{self.kind}' (known: {', '.join(sorted(JOINABLE_KINDS))})")
        return self


class JoinBlock(_Strict):
    """Wraps the loop in `Join(joinables, enable, throw_on_early_termination, **kwargs)`."""

    enabled: bool = True
    joinables: list[str] = Field(min_length=1)
    throw_on_early_termination: bool = False
    kwargs: dict[str, bool | int | float | str] = Field(default_factory=dict)


class Group(_Strict):
    """A sub-group created on every rank with `dist.new_group(ranks)`."""

    name: str
    ranks: list[int] = Field(min_length=1)


# --------------------------------------------------------------------------- steps
class _Cond(_Strict):
    """Conditions shared by every step: it runs on iteration i (0-based) of rank r only when
    all given conditions hold."""

    every: int | None = Field(default=None, ge=1, description="only when i % every == 0")
    ranks: list[int] | None = Field(default=None, description="only on these ranks")
    below: int | None = Field(default=None, ge=0, description="only for iterations i < below")
    from_iteration: int | None = Field(default=None, ge=0, description="only for i >= from_iteration")

    def applies(self, rank: int, i: int | None) -> bool:
        if self.ranks is not None and rank not in self.ranks:
            return False
        if i is None:
            return self.every is None and self.below is None and self.from_iteration is None
        if self.every is not None and i % self.every != 0:
            return False
        if self.below is not None and i >= self.below:
            return False
        return not (self.from_iteration is not None and i < self.from_iteration)


class ComputeStep(_Cond):
    kind: Literal["compute"]
    seconds: float = Field(ge=0)


class ForwardStep(_Cond):
    """DDP forward (`_pre_forward` collectives). `no_sync` = inside `model.no_sync()`."""

    kind: Literal["forward"]
    no_sync: bool = False


class BackwardStep(_Cond):
    """DDP backward: gradient bucket all-reduces from the reducer."""

    kind: Literal["backward"]


class OptimizerStep(_Cond):
    kind: Literal["optimizer_step"]


class JoinableCallStep(_Cond):
    """Calls a custom joinable once (Counter.__call__ / AllReducer.__call__)."""

    kind: Literal["joinable_call"]
    joinable: str
    num_allreduces: int | None = Field(default=None, ge=0, description="AllReducer: default [join].kwargs.num_allreduces or 1")


class CollectiveStep(_Cond):
    """A raw torch.distributed collective issued by the training loop.

    `value` is what every element of the input holds: a number, or "rank" (the global
    rank), or "iteration" (the 0-based input index). `observe` names the result so it
    appears in the rank's observed values (appended once per execution).
    """

    kind: Literal["collective"]
    op: CollectiveOp
    numel: int = Field(default=1, ge=0)
    dtype: Dtype = "float32"
    reduce_op: ReduceOp = "sum"
    root: int = Field(default=0, ge=0, description="global rank: broadcast src / reduce dst / gather dst / scatter src")
    group: str = WORLD
    async_op: bool = Field(default=False, alias="async")
    wait: Literal["now", "end_of_iteration", "never"] = "now"
    value: float | Literal["rank", "iteration"] = 1.0
    observe: str | None = None
    name: str | None = None

    model_config = ConfigDict(extra="forbid", frozen=True, populate_by_name=True)


class P2PStep(_Cond):
    """Point-to-point: `src` sends `numel` elements to `dst`; other ranks skip the step.

    `blocking = false` uses isend/irecv (waited at once, or at end of iteration with
    `wait = "end_of_iteration"`).
    """

    kind: Literal["p2p"]
    src: int = Field(ge=0)
    dst: int = Field(ge=0)
    numel: int = Field(default=1, ge=1)
    dtype: Dtype = "float32"
    tag: int = 0
    blocking: bool = True
    wait: Literal["now", "end_of_iteration"] = "now"
    value: float | Literal["rank", "iteration"] = "rank"
    observe: str | None = None


class SleepStep(_Cond):
    """Stay alive for a while without communicating (wall time on the real backend)."""

    kind: Literal["sleep"]
    seconds: float = Field(ge=0)


Step = Annotated[
    ComputeStep
    | ForwardStep
    | BackwardStep
    | OptimizerStep
    | JoinableCallStep
    | CollectiveStep
    | P2PStep
    | SleepStep,
    Field(discriminator="kind"),
]


class Expect(_Strict):
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


class Scenario(_Strict):
    """A complete, validated scenario. Build with `load_scenario(path)` or `parse_scenario(dict)`."""

    name: str = "scenario"
    description: str = ""
    world_size: int = Field(ge=1, le=1024)
    backend: Literal["gloo", "nccl"] = "gloo"
    seed: int = 0
    timeout_s: float = Field(default=10.0, gt=0, description="real backend watchdog")
    topology: Topology = Field(default_factory=Topology)
    inputs: Inputs
    model: Model | None = None
    optimizer: Optimizer | None = None
    joinables: list[JoinableDecl] = Field(default_factory=list)
    groups: list[Group] = Field(default_factory=list)
    join: JoinBlock | None = None
    loop: list[Step] = Field(default_factory=list)
    # Steps every rank runs after its loop (after the Join block exits).
    after: list[Step] = Field(default_factory=list)
    # What a rank does when its program ends: "exit" = the process ends (peers that still
    # need it fail at once); "stay" = it stays alive until every rank is done (peers block).
    on_finish: Literal["exit", "stay"] = "exit"
    expect: Expect | None = None

    @model_validator(mode="after")
    def _cross_check(self) -> Scenario:
        _cross_validate(self)
        return self

    # ---- conveniences used by both simulator and real backend
    def counts(self) -> list[int]:
        return self.inputs.per_rank(self.world_size)

    def group_ranks(self, group: str) -> list[int]:
        if group == WORLD:
            return list(range(self.world_size))
        for g in self.groups:
            if g.name == group:
                return sorted(g.ranks)
        raise KeyError(group)

    def joinable_kind(self, name: str) -> str:
        """Kind of a joinable named in [join].joinables: 'ddp', 'zero', 'counter', 'allreducer'."""
        if name in ("ddp", "zero"):
            return name
        for j in self.joinables:
            if j.name == name:
                return j.kind
        raise KeyError(name)


class _FieldError(ValueError):
    def __init__(self, loc: str, msg: str):
        super().__init__(f"{loc}: {msg}")
        self.loc = loc
        self.msg = msg


def _cross_validate(s: Scenario) -> None:
    """Checks that need the whole scenario: ranks in range, names that resolve."""
    w = s.world_size
    counts = s.counts()
    if len(counts) != w:
        raise _FieldError("inputs.counts", f"has {len(counts)} entries but world_size is {w}")
    for r, c in enumerate(counts):
        if c < 0:
            raise _FieldError("inputs", f"rank {r} gets {c} inputs (base + offset * rank must be >= 0)")
    names = {WORLD}
    for gi, g in enumerate(s.groups):
        if g.name in names:
            raise _FieldError(f"groups[{gi}].name", f"duplicate group name '{g.name}'")
        names.add(g.name)
        for r in g.ranks:
            if not 0 <= r < w:
                raise _FieldError(f"groups[{gi}].ranks", f"rank {r} out of range for world_size {w}")
        if len(set(g.ranks)) != len(g.ranks):
            raise _FieldError(f"groups[{gi}].ranks", "duplicate rank")
    jnames = {"ddp", "zero"}
    for ji, j in enumerate(s.joinables):
        if j.name in jnames:
            raise _FieldError(f"joinables[{ji}].name", f"duplicate or reserved joinable name '{j.name}'")
        if j.group not in names:
            raise _FieldError(f"joinables[{ji}].group", f"unknown group '{j.group}'")
        jnames.add(j.name)
    if s.join is not None:
        for k, name in enumerate(s.join.joinables):
            if name == "ddp" and s.model is None:
                raise _FieldError(f"join.joinables[{k}]", "'ddp' needs a [model] table")
            if name == "zero" and not (s.optimizer and s.optimizer.zero):
                raise _FieldError(f"join.joinables[{k}]", "'zero' needs [optimizer] with zero = true")
            if name not in jnames:
                raise _FieldError(f"join.joinables[{k}]", f"unknown joinable '{name}'")
        if len(set(s.join.joinables)) != len(s.join.joinables):
            raise _FieldError("join.joinables", "a joinable is listed twice")
    if s.optimizer is not None and s.optimizer.zero and s.model is None:
        raise _FieldError("optimizer.zero", "ZeroRedundancyOptimizer needs a [model] table")
    for section, steps in (("loop", s.loop), ("after", s.after)):
        for i, st in enumerate(steps):
            loc = f"{section}[{i}]"
            if st.ranks is not None:
                for r in st.ranks:
                    if not 0 <= r < w:
                        raise _FieldError(f"{loc}.ranks", f"rank {r} out of range for world_size {w}")
            if section == "after" and (st.every is not None or st.below is not None or st.from_iteration is not None):
                raise _FieldError(loc, "iteration conditions (every/below/from_iteration) make no sense after the loop")
            if isinstance(st, (ForwardStep, BackwardStep)) and s.model is None:
                raise _FieldError(f"{loc}.kind", f"'{st.kind}' needs a [model] table")
            if isinstance(st, OptimizerStep) and s.optimizer is None:
                raise _FieldError(f"{loc}.kind", "'optimizer_step' needs an [optimizer] table")
            if isinstance(st, JoinableCallStep) and st.joinable not in {j.name for j in s.joinables}:
                raise _FieldError(f"{loc}.joinable", f"unknown joinable '{st.joinable}'")
            if isinstance(st, CollectiveStep):
                if st.group not in names:
                    raise _FieldError(f"{loc}.group", f"unknown group '{st.group}'")
                members = s.group_ranks(st.group)
                if st.op in ROOTED_OPS and st.root not in members:
                    raise _FieldError(f"{loc}.root", f"rank {st.root} is not in group '{st.group}'")
                if st.ranks is not None and not set(st.ranks) <= set(members):
                    raise _FieldError(f"{loc}.ranks", f"ranks {st.ranks} are not all in group '{st.group}'")
                if st.op in ("reduce_scatter", "scatter", "all_to_all") and st.numel % len(members):
                    raise _FieldError(f"{loc}.numel", f"{st.op} needs numel divisible by the group size {len(members)}")
                if st.reduce_op in BITWISE_REDUCE_OPS and st.dtype.startswith(("float", "bfloat")):
                    raise _FieldError(f"{loc}.reduce_op", f"{st.reduce_op} needs an integer dtype, not {st.dtype}")
                if not st.async_op and st.wait != "now":
                    raise _FieldError(f"{loc}.wait", "only async collectives can wait later")
            if isinstance(st, P2PStep):
                for fld in ("src", "dst"):
                    r = getattr(st, fld)
                    if not 0 <= r < w:
                        raise _FieldError(f"{loc}.{fld}", f"rank {r} out of range for world_size {w}")
                if st.src == st.dst:
                    raise _FieldError(f"{loc}.dst", "a rank cannot send to itself")
                if st.blocking and st.wait != "now":
                    raise _FieldError(f"{loc}.wait", "only non-blocking p2p can wait later")
    if s.expect is not None:
        e = s.expect
        for fld in ("inputs_processed", "status", "collectives"):
            v = getattr(e, fld)
            if v is not None and len(v) != w:
                raise _FieldError(f"expect.{fld}", f"has {len(v)} entries but world_size is {w}")
        for k in e.errors:
            if not k.isdigit() or int(k) >= w:
                raise _FieldError(f"expect.errors.{k}", f"not a rank of world_size {w}")
        for k, v in e.observed.items():
            if len(v) != w:
                raise _FieldError(f"expect.observed.{k}", f"has {len(v)} entries but world_size is {w}")
    if s.topology.preset is None:
        node_names = {n.name for n in s.topology.nodes}
        for li, link in enumerate(s.topology.links):
            for end in ("a", "b"):
                if getattr(link, end) not in node_names:
                    raise _FieldError(f"topology.links[{li}].{end}", f"unknown node '{getattr(link, end)}'")
        placed = [r for n in s.topology.nodes for r in n.ranks]
        for r in placed:
            if not 0 <= r < w:
                raise _FieldError("topology.nodes", f"rank {r} out of range for world_size {w}")
        missing = sorted(set(range(w)) - set(placed))
        if missing:
            raise _FieldError("topology.nodes", f"ranks {missing} are not placed on any node")
        if len(placed) != len(set(placed)):
            raise _FieldError("topology.nodes", "a rank is placed on two nodes")


def _format_validation_error(err: ValidationError) -> str:
    """One line naming the first offending field, e.g. ``world_size: Input should be >= 1``."""
    first = err.errors()[0]
    loc_parts: list[str] = []
    for part in first["loc"]:
        if isinstance(part, int):
            loc_parts.append(f"[{part}]")
        elif part in {"compute", "forward", "backward", "optimizer_step", "joinable_call", "collective", "p2p", "sleep"}:
            continue  # discriminator tag pydantic inserts into the path
        else:
            loc_parts.append(("." if loc_parts else "") + str(part))
    loc = "".join(loc_parts) or "scenario"
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    ctx_err = first.get("ctx", {}).get("error")
    if isinstance(ctx_err, _FieldError):
        return str(ctx_err)
    if first["type"] == "union_tag_invalid":
        msg = f"unknown step kind {first['input'].get('kind')!r}" if isinstance(first.get("input"), dict) else msg
    return f"{loc}: {msg}"


def parse_scenario(data: dict[str, Any], source: str = "<dict>") -> Scenario:
    """Validate a dict into a Scenario, raising ScenarioError with a one-line message."""
    try:
        return Scenario.model_validate(data)
    except ValidationError as err:  # _cross_validate's _FieldError arrives wrapped in it
        raise ScenarioError(f"{source}: {_format_validation_error(err)}") from None


def read_toml(path: str | Path, what: str = "scenario") -> dict[str, Any]:
    """A TOML file as a dict, or a one-line ScenarioError (unreadable file, bad TOML)."""
    p = Path(path)
    try:
        text = p.read_text()
    except OSError as err:
        raise ScenarioError(f"{p}: cannot read {what} file ({err.strerror})") from None
    try:
        return tomllib.loads(text)
    except tomllib.TOMLDecodeError as err:
        raise ScenarioError(f"{p}: not valid TOML ({err})") from None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a TOML scenario file."""
    return parse_scenario(read_toml(path), source=str(path))


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """Plain dict (TOML-ready: no None values) that parses back to the same scenario."""
    return _drop_none(s.model_dump(by_alias=True, exclude_defaults=True))


def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x
