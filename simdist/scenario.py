"""The scenario: one validated description of a distributed training loop.

A single `Scenario` feeds both the simulator and the real backend, so everything either
side needs to reproduce a run lives here (its tables in `simdist.schema`), and nothing
else does. Files are TOML; the same model can be built from Python
(`Scenario.model_validate(dict)` or the classes).

Validation is strict (unknown keys are errors) and every error names the offending field
as a dotted path, e.g. ``loop[2].group: unknown group 'evens'``, because users edit these
files by hand and a traceback tells them nothing.

See docs/scenarios.md for the full reference with a worked example.
"""

from __future__ import annotations

import re
from pathlib import Path
from typing import Any, Literal

import networkx as nx
from pydantic import Field, ValidationError, model_validator

from simdist.collectives.algorithms import resolve as resolve_algorithm
from simdist.errors import ScenarioError
from simdist.limits import MAX_TIMEOUT_S, MAX_WORLD_SIZE
from simdist.schema import (
    STEP_KINDS,
    BackwardStep,
    CollectiveStep,
    ComputeStep,
    Expect,
    ForwardStep,
    Group,
    Inputs,
    Int64,
    JoinableCallStep,
    JoinableDecl,
    JoinBlock,
    Model,
    Optimizer,
    OptimizerStep,
    P2PStep,
    SleepStep,
    Step,
    Strict,
    TopoLink,
    Topology,
    TopoNode,
)
from simdist.userfiles import check_data, format_path, read_toml
from simdist.vocab import (
    BITWISE_REDUCE_OPS,
    JOIN_KWARGS,
    MODEL_JOINABLES,
    PRESET_MAX_WORLD,
    PRESETS,
    ROOTED_OPS,
    WORLD,
    fill_fits,
)

# The tables stay importable from here, where a scenario's users look for them.
__all__ = [
    "BackwardStep", "CollectiveStep", "ComputeStep", "Expect", "ForwardStep", "Group", "Inputs", "JoinBlock",
    "JoinableCallStep", "JoinableDecl", "Model", "Optimizer", "OptimizerStep", "P2PStep", "Scenario", "SleepStep",
    "Step", "Target", "TopoLink", "TopoNode", "Topology", "check_target", "load_scenario", "parse_scenario",
    "read_toml", "scenario_to_dict",
]

Target = Literal["sim", "real"]  # which side runs a scenario: the simulator or real torch.distributed


class Scenario(Strict):
    """A complete, validated scenario. Build with `load_scenario(path)` or `parse_scenario(dict)`."""

    name: str = "scenario"
    description: str = ""
    world_size: int = Field(ge=1, le=MAX_WORLD_SIZE)
    backend: Literal["gloo", "nccl"] = "gloo"
    seed: Int64 = 0
    timeout_s: float = Field(default=10.0, gt=0, le=MAX_TIMEOUT_S, description="real backend watchdog (at most a day)")
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
        """Kind of a joinable named in [join].joinables: 'ddp', 'zero', or a [[joinables]] kind."""
        if name in MODEL_JOINABLES:
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

    @classmethod
    def of(cls, err: ScenarioError) -> _FieldError:
        """A ScenarioError raised elsewhere ("FIELD: message") as a field error of this scenario."""
        loc, _, msg = str(err).partition(": ")
        return cls(loc, msg)


def _cross_validate(s: Scenario) -> None:
    """Checks that need the whole scenario: ranks in range, names that resolve (in this order:
    the first failing one is the error a user sees)."""
    _check_inputs(s)
    groups = _check_groups(s)
    _check_joinables(s, groups)
    _check_join_kwargs(s)
    if s.optimizer is not None and s.optimizer.zero and s.model is None:
        raise _FieldError("optimizer.zero", "ZeroRedundancyOptimizer needs a [model] table")
    for section, steps in (("loop", s.loop), ("after", s.after)):
        for i, st in enumerate(steps):
            _check_step(s, st, section, f"{section}[{i}]", groups)
    _check_expect(s)
    _check_topology(s)


def _check_inputs(s: Scenario) -> None:
    counts = s.counts()
    if len(counts) != s.world_size:
        raise _FieldError("inputs.counts", f"has {len(counts)} entries but world_size is {s.world_size}")
    for r, c in enumerate(counts):
        if c < 0:
            raise _FieldError("inputs", f"rank {r} gets {c} inputs (base + offset * rank must be >= 0)")


def _check_groups(s: Scenario) -> set[str]:
    """The group names steps may use."""
    names = {WORLD}
    for gi, g in enumerate(s.groups):
        if g.name in names:
            raise _FieldError(f"groups[{gi}].name", f"duplicate group name '{g.name}'")
        names.add(g.name)
        for r in g.ranks:
            _check_rank(s, r, f"groups[{gi}].ranks")
        if len(set(g.ranks)) != len(g.ranks):
            raise _FieldError(f"groups[{gi}].ranks", "duplicate rank")
    return names


def _check_rank(s: Scenario, r: int, loc: str) -> None:
    if not 0 <= r < s.world_size:
        raise _FieldError(loc, f"rank {r} out of range for world_size {s.world_size}")


def _check_joinables(s: Scenario, groups: set[str]) -> None:
    """[[joinables]] names and groups, and what [join] names."""
    jnames = set(MODEL_JOINABLES)
    for ji, j in enumerate(s.joinables):
        if j.name in jnames:
            raise _FieldError(f"joinables[{ji}].name", f"duplicate or reserved joinable name '{j.name}'")
        if j.group not in groups:
            raise _FieldError(f"joinables[{ji}].group", f"unknown group '{j.group}'")
        jnames.add(j.name)
    if s.join is None:
        return
    for k, name in enumerate(s.join.joinables):
        if name == "ddp" and s.model is None:
            raise _FieldError(f"join.joinables[{k}]", "'ddp' needs a [model] table")
        if name == "zero" and not (s.optimizer and s.optimizer.zero):
            raise _FieldError(f"join.joinables[{k}]", "'zero' needs [optimizer] with zero = true")
        if name not in jnames:
            raise _FieldError(f"join.joinables[{k}]", f"unknown joinable '{name}'")
    if len(set(s.join.joinables)) != len(s.join.joinables):
        raise _FieldError("join.joinables", "a joinable is listed twice")


def _check_join_kwargs(s: Scenario) -> None:
    """The [join].kwargs the models read must have their type (JOIN_KWARGS); others pass."""
    for k, v in (s.join.kwargs if s.join is not None else {}).items():
        want = JOIN_KWARGS.get(k)
        if want is bool and not isinstance(v, bool):
            raise _FieldError(f"join.kwargs.{k}", "must be true or false")
        if want is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            raise _FieldError(f"join.kwargs.{k}", "must be a whole number >= 0")


def _fill_values(s: Scenario, st: CollectiveStep | P2PStep, section: str, ranks: list[int]) -> list[float | int]:
    """The extreme values a step's `value` takes on these ranks (what torch.full must accept)."""
    if st.value == "rank":
        return [min(ranks), max(ranks)] if ranks else []
    if st.value == "iteration":
        if section == "after":
            return [-1]  # interpret.fill_value: "iteration" outside the loop
        last = max(s.counts(), default=0) - 1
        if st.below is not None:
            last = min(last, st.below - 1)
        return [0, last] if last >= 0 else []
    return [st.value]


def _check_value(s: Scenario, st: CollectiveStep | P2PStep, section: str, loc: str, ranks: list[int]) -> None:
    for v in _fill_values(s, st, section, ranks):
        if not fill_fits(v, st.dtype):
            what = f"{st.value} = {v}" if isinstance(st.value, str) else f"{v}"
            raise _FieldError(f"{loc}.value", f"{what} does not fit {st.dtype} (torch.full raises: value cannot "
                                              f"be converted to type {st.dtype} without overflow)")


def _check_step(s: Scenario, st: Step, section: str, loc: str, groups: set[str]) -> None:
    for r in st.ranks or []:
        _check_rank(s, r, f"{loc}.ranks")
    if section == "after" and (st.every is not None or st.below is not None or st.from_iteration is not None):
        raise _FieldError(loc, "iteration conditions (every/below/from_iteration) make no sense after the loop")
    if isinstance(st, (ForwardStep, BackwardStep)) and s.model is None:
        raise _FieldError(f"{loc}.kind", f"'{st.kind}' needs a [model] table")
    if isinstance(st, OptimizerStep) and s.optimizer is None:
        raise _FieldError(f"{loc}.kind", "'optimizer_step' needs an [optimizer] table")
    if isinstance(st, JoinableCallStep) and st.joinable not in {j.name for j in s.joinables}:
        raise _FieldError(f"{loc}.joinable", f"unknown joinable '{st.joinable}'")
    if isinstance(st, CollectiveStep):
        _check_collective(s, st, loc, groups)
        members = s.group_ranks(st.group)
        _check_value(s, st, section, loc, [r for r in members if st.ranks is None or r in st.ranks])
    if isinstance(st, P2PStep):
        for fld in ("src", "dst"):
            _check_rank(s, getattr(st, fld), f"{loc}.{fld}")
        _check_value(s, st, section, loc, [st.src])
        if st.src == st.dst:
            raise _FieldError(f"{loc}.dst", "a rank cannot send to itself")
        if st.blocking and st.wait != "now":
            raise _FieldError(f"{loc}.wait", "only non-blocking p2p can wait later")


def _check_collective(s: Scenario, st: CollectiveStep, loc: str, groups: set[str]) -> None:
    if st.group not in groups:
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


def _check_expect(s: Scenario) -> None:
    e, w = s.expect, s.world_size
    if e is None:
        return
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


def _check_topology(s: Scenario) -> None:
    """Everything the cost model would otherwise reject only when the run starts: preset,
    algorithms, profile file, nodes and links."""
    t = s.topology
    for op, algo in t.algorithms.items():
        try:
            resolve_algorithm(op, algo, f"topology.algorithms.{op}")
        except ScenarioError as e:
            raise _FieldError.of(e) from None
    if t.profile is not None:
        # Imported here: loading `simdist.network` loads simpy, which only a scenario that
        # names a calibrated profile needs to pay for at load time.
        from simdist.network.profile import load_profile

        try:
            load_profile(t.profile)
        except ScenarioError as e:
            raise _FieldError.of(e) from None
    if t.preset is not None:
        if t.preset not in PRESETS:
            raise _FieldError("topology.preset", f"unknown preset '{t.preset}' (choose from {', '.join(PRESETS)})")
        if s.world_size > PRESET_MAX_WORLD.get(t.preset, MAX_WORLD_SIZE):
            raise _FieldError("topology.preset", f"{t.preset} has {PRESET_MAX_WORLD[t.preset]} GPUs, world_size "
                                                 f"{s.world_size} does not fit")
        return
    _check_nodes(s)


def _check_nodes(s: Scenario) -> None:
    """Explicit nodes and links: names unique and known, every rank placed once, connected."""
    names: set[str] = set()
    for i, n in enumerate(s.topology.nodes):
        if n.name in names:
            raise _FieldError(f"topology.nodes[{i}].name", f"duplicate node '{n.name}'")
        names.add(n.name)
    graph = nx.Graph()
    graph.add_nodes_from(names)
    for li, link in enumerate(s.topology.links):
        for end in ("a", "b"):
            if getattr(link, end) not in names:
                raise _FieldError(f"topology.links[{li}].{end}", f"unknown node '{getattr(link, end)}'")
        if link.a == link.b:
            raise _FieldError(f"topology.links[{li}]", "a link joins two different nodes")
        graph.add_edge(link.a, link.b)
    placed = [r for n in s.topology.nodes for r in n.ranks]
    for r in placed:
        _check_rank(s, r, "topology.nodes")
    missing = sorted(set(range(s.world_size)) - set(placed))
    if missing:
        raise _FieldError("topology.nodes", f"ranks {missing} are not placed on any node")
    if len(placed) != len(set(placed)):
        raise _FieldError("topology.nodes", "a rank is placed on two nodes")
    where = {r: n.name for n in s.topology.nodes for r in n.ranks}
    reach = nx.node_connected_component(graph, where[0])
    lost = sorted(r for r in range(s.world_size) if where[r] not in reach)
    if lost:
        raise _FieldError("topology.links", f"ranks {lost} cannot reach rank 0 (the topology is disconnected)")


def check_target(s: Scenario, target: Target, source: str = "<dict>") -> None:
    """Reject, as a one-line ScenarioError naming the field, what `target` cannot run:
    a `[[joinables]]` kind without an implementation on that side (see the registry; the
    schema has already checked every kind against the simulator's)."""
    if target == "sim" or not s.joinables:
        return
    # imported here: the registry names the simulator's classes, which load the engine
    from simdist.torchmodels.registry import JOINABLE_KINDS, kinds_for

    for i, j in enumerate(s.joinables):
        if not JOINABLE_KINDS[j.kind].real:
            raise ScenarioError(f"{source}: joinables[{i}].kind: '{j.kind}' has no real implementation "
                                f"(the real backend has: {', '.join(kinds_for('real'))})")


def _format_validation_error(err: ValidationError) -> str:
    """One line naming the first offending field, e.g. ``world_size: Input should be >= 1``."""
    first = err.errors()[0]
    # pydantic puts a step's discriminator tag into the path, and a union's member type
    loc = format_path([p for p in first["loc"] if p not in STEP_KINDS and not _union_member(p)])
    msg = first["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, ") :]
    if first["type"] == "extra_forbidden":
        msg = "unknown key"
    elif first["type"].endswith("_type") and "input" in first:
        msg += f", got {_brief(first['input'])}"
    ctx_err = first.get("ctx", {}).get("error")
    if isinstance(ctx_err, _FieldError):
        return str(ctx_err)
    if first["type"] == "union_tag_invalid":
        msg = f"unknown step kind {first['input'].get('kind')!r}" if isinstance(first.get("input"), dict) else msg
    return f"{loc}: {msg}"


_UNION_MEMBER = re.compile(r"^(float|int|str|bool|(list|dict|literal|tuple|nullable)\[.*\]|function-.*)$")


def _union_member(part: object) -> bool:
    """Whether a pydantic error-path part names a union's member type, not a field."""
    return isinstance(part, str) and _UNION_MEMBER.match(part) is not None


def _brief(value: object) -> str:
    """A user's value, short: what a type error quotes."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


def parse_scenario(data: dict[str, Any], source: str = "<dict>", target: Target = "sim") -> Scenario:
    """Validate a dict into a Scenario that `target` can run, raising ScenarioError with a
    one-line message."""
    check_data(data, source)
    try:
        s = Scenario.model_validate(data)
    except ValidationError as err:  # _cross_validate's _FieldError arrives wrapped in it
        raise ScenarioError(f"{source}: {_format_validation_error(err)}") from None
    check_target(s, target, source)
    return s


def load_scenario(path: str | Path, target: Target = "sim") -> Scenario:
    """Read and validate a TOML scenario file for `target`: "sim" (the simulator) or "real"
    (real torch.distributed processes, which implement fewer joinable kinds)."""
    return parse_scenario(read_toml(path), source=str(path), target=target)


def scenario_to_dict(s: Scenario) -> dict[str, Any]:
    """Plain dict (TOML-ready: no None values) that parses back to the same scenario."""
    return _drop_none(s.model_dump(by_alias=True, exclude_defaults=True))


def _drop_none(x: Any) -> Any:
    if isinstance(x, dict):
        return {k: _drop_none(v) for k, v in x.items() if v is not None}
    if isinstance(x, list):
        return [_drop_none(v) for v in x]
    return x
