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

from pathlib import Path
from typing import Any, Literal

import tomllib
from pydantic import Field, ValidationError, model_validator

from simdist.errors import ScenarioError
from simdist.schema import (
    STEP_KINDS,
    BackwardStep,
    CollectiveStep,
    ComputeStep,
    Expect,
    ForwardStep,
    Group,
    Inputs,
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
from simdist.vocab import BITWISE_REDUCE_OPS, MODEL_JOINABLES, ROOTED_OPS, WORLD

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


def _cross_validate(s: Scenario) -> None:
    """Checks that need the whole scenario: ranks in range, names that resolve (in this order:
    the first failing one is the error a user sees)."""
    _check_inputs(s)
    groups = _check_groups(s)
    _check_joinables(s, groups)
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
    if isinstance(st, P2PStep):
        for fld in ("src", "dst"):
            _check_rank(s, getattr(st, fld), f"{loc}.{fld}")
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
    problem = topology_problem(s.topology, s.world_size)
    if problem is not None:
        raise _FieldError(*problem)


def topology_problem(topo: Topology, world_size: int) -> tuple[str, str] | None:
    """(field, message) of the first thing wrong with `topo`'s nodes for `world_size` ranks,
    or None: a link to an unknown node, a rank placed on no node, twice, or out of range.
    A scenario's topology and a script's (`--topology`, whose world size is known only once
    its ranks start) are checked by this one rule; a preset's name by the cost model."""
    if topo.preset is not None:
        return None
    node_names = {n.name for n in topo.nodes}
    for li, link in enumerate(topo.links):
        for end in ("a", "b"):
            if getattr(link, end) not in node_names:
                return f"topology.links[{li}].{end}", f"unknown node '{getattr(link, end)}'"
    placed = [r for n in topo.nodes for r in n.ranks]
    for r in placed:
        if not 0 <= r < world_size:
            return "topology.nodes", f"rank {r} out of range for world_size {world_size}"
    missing = sorted(set(range(world_size)) - set(placed))
    if missing:
        return "topology.nodes", f"ranks {missing} are not placed on any node"
    if len(placed) != len(set(placed)):
        return "topology.nodes", "a rank is placed on two nodes"
    return None


def load_topology(spec: str | Path) -> Topology:
    """A topology on its own (a script has no scenario file to hold one): a preset name, or a
    TOML file with a `[topology]` table as a scenario has (or that table's keys at the top).
    Bad input raises a one-line ScenarioError naming the field."""
    from simdist.network.topology import PRESETS  # (networkx: only when a topology is named)

    if str(spec) in PRESETS:
        return Topology(preset=str(spec))
    if not Path(spec).is_file():
        raise ScenarioError(f"topology: '{spec}' is neither a preset ({', '.join(PRESETS)}) nor a file")
    data = read_toml(spec, "topology")
    try:
        return Topology.model_validate(data.get("topology", data))
    except ValidationError as err:
        raise ScenarioError(f"{spec}: topology.{_format_validation_error(err)}") from None


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
    loc_parts: list[str] = []
    for part in first["loc"]:
        if isinstance(part, int):
            loc_parts.append(f"[{part}]")
        elif part in STEP_KINDS:
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


def parse_scenario(data: dict[str, Any], source: str = "<dict>", target: Target = "sim") -> Scenario:
    """Validate a dict into a Scenario that `target` can run, raising ScenarioError with a
    one-line message."""
    try:
        s = Scenario.model_validate(data)
    except ValidationError as err:  # _cross_validate's _FieldError arrives wrapped in it
        raise ScenarioError(f"{source}: {_format_validation_error(err)}") from None
    check_target(s, target, source)
    return s


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
