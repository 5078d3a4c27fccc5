"""The scenario: one validated description of a distributed training loop.

A single `Scenario` feeds both the simulator and the real backend, so everything either
side needs to reproduce a run lives here (its tables in `simdist.schema`), and nothing
else does. Files are TOML; the same model can be built from Python
(`Scenario.model_validate(dict)` or the classes).

Validation is strict (unknown keys are errors) and every error names the offending field
as a dotted path, e.g. ``loop[2].group: unknown group 'evens'``, because users edit these
files by hand and a traceback tells them nothing. Every problem of a file is reported at
once, one line each (the cross-table checks are in `simdist.crosscheck`).

See docs/scenarios.md for the full reference with a worked example.
"""

from __future__ import annotations

import copy
import re
from pathlib import Path
from typing import Any, Literal

from pydantic import Field, ValidationError, model_validator
from pydantic.json_schema import GenerateJsonSchema, JsonSchemaValue
from pydantic_core import core_schema

from simdist import crosscheck
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
    RaiseStep,
    SleepStep,
    Step,
    StopStep,
    Strict,
    TopoLink,
    Topology,
    TopoNode,
    ValueWhen,
    When,
)
from simdist.userfiles import check_data, read_toml
from simdist.vocab import MODEL_JOINABLES, PRESETS, WORLD

# The tables stay importable from here, where a scenario's users look for them.
__all__ = [
    "BackwardStep", "CollectiveStep", "ComputeStep", "Expect", "ForwardStep", "Group", "Inputs", "JoinBlock",
    "JoinableCallStep", "JoinableDecl", "Model", "Optimizer", "OptimizerStep", "P2PStep", "RaiseStep", "Scenario", "SleepStep",
    "Step", "StopStep", "Target", "TopoLink", "TopoNode", "Topology", "ValueWhen", "When", "check_target", "load_scenario",
    "json_schema", "parse_scenario", "read_toml", "scenario_to_dict",
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
    model: Model | None = Field(default=None, description="the DDP model named 'ddp' on WORLD (or as it says)")
    models: list[Model] = Field(default_factory=list, description="more DDP models, each named, on its own group")
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
        p = crosscheck.Problems()
        crosscheck.check_inputs(p, self.inputs, self.world_size)
        names = crosscheck.names_of(p, self.world_size, self.groups, self.model, self.models, self.joinables,
                                    self.optimizer, self.loop + self.after)
        crosscheck.check_optimizer(p, names)
        crosscheck.check_join(p, names, self.join)
        crosscheck.check_steps(p, names, "loop", self.loop, self.counts())
        crosscheck.check_steps(p, names, "after", self.after, self.counts())
        crosscheck.check_expect(p, self.expect, self.world_size)
        crosscheck.check_topology(p, self.topology, self.world_size)
        crosscheck.check_connected(p, self.topology, self.world_size)
        if p.items:
            raise _FieldErrors(p.items)
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

    def all_models(self) -> list[Model]:
        """`[model]` then `[[models]]`, in file order."""
        return ([self.model] if self.model is not None else []) + list(self.models)

    def model_named(self, name: str | None) -> Model:
        """The model a forward/backward step names (None: the only one)."""
        models = self.all_models()
        if name is None:
            return models[0]
        return next(m for m in models if m.name == name)

    def optimizer_models(self) -> list[Model]:
        """The models whose parameters the optimizer updates, in file order."""
        assert self.optimizer is not None
        wanted = self.optimizer.models
        return [m for m in self.all_models() if wanted is None or m.name in wanted]

    def zero_group(self) -> str:
        """ZeRO's process group (validated to exist when `optimizer.zero`)."""
        assert self.optimizer is not None
        return crosscheck.zero_group(self.optimizer, self.optimizer_models()) or WORLD

    def joinable_kind(self, name: str) -> str:
        """Kind of a joinable named in [join].joinables: 'ddp' (any model), 'zero', or a [[joinables]] kind."""
        if name in MODEL_JOINABLES and name != "ddp":
            return name
        if any(m.name == name for m in self.all_models()):
            return "ddp"
        for j in self.joinables:
            if j.name == name:
                return j.kind
        raise KeyError(name)


class _FieldErrors(ValueError):
    """Every cross-check problem of a scenario, raised from its validator (pydantic wraps it)."""

    def __init__(self, items: list[tuple[str, str]]):
        super().__init__("; ".join(f"{loc}: {msg}" for loc, msg in items))
        self.items = items


def check_target(s: Scenario, target: Target, source: str = "<dict>") -> None:
    """Reject, as a one-line ScenarioError naming the field, what `target` cannot run:
    a `[[joinables]]` kind without an implementation on that side (see the registry; the
    schema has already checked every kind against the simulator's)."""
    if target == "sim" or not s.joinables:
        return
    # imported here: the registry names the simulator's classes, which load the engine
    from simdist.torchmodels.registry import JOINABLE_KINDS, kinds_for

    lines = [f"{source}: joinables[{i}].kind: '{j.kind}' has no real implementation (the real backend has: "
             f"{', '.join(kinds_for('real'))})" for i, j in enumerate(s.joinables) if not JOINABLE_KINDS[j.kind].real]
    if lines:
        raise ScenarioError("\n".join(lines))


# The top-level fields whose schema errors do not hide the cross-checks: nothing else refers
# to them, so the scenario is cross-checked with their defaults (see `_problems`).
_INDEPENDENT = frozenset({"name", "description", "seed", "timeout_s", "backend", "on_finish", "expect", "topology"})
_STEP_LISTS = ("loop", "after")


def _problems(data: dict[str, Any]) -> tuple[Scenario | None, list[str]]:
    """The scenario, or every problem with it as "field: message" lines.

    Schema errors (types, ranges, unknown keys) come first, all of them; the cross-checks
    need valid tables, so they run when the schema errors are only in fields nothing
    refers to (`_INDEPENDENT`) or in steps: those are left at their defaults or replaced
    by a no-op step that records what the broken one observed, and the cross-check
    problems of the rest follow."""
    try:
        return Scenario.model_validate(data), []
    except ValidationError as err:
        lines = _format_validation_errors(err)
        repaired = _repaired(data, err)
    if repaired is not None:
        try:
            Scenario.model_validate(repaired)
        except ValidationError as err2:
            lines += [x for x in _format_validation_errors(err2) if x not in lines]
    return None, sorted(lines, key=lambda line: _file_order(data, line))


_LEAD = re.compile(r"^([A-Za-z_]\w*)(?:\[(\d+)\])?")


def _file_order(data: dict[str, Any], line: str) -> tuple[int, int]:
    """Where a problem's field is in the file: its top-level key's position, then its index."""
    m = _LEAD.match(line)
    keys = list(data)
    if m is None or m.group(1) not in keys:
        return (len(keys), 0)
    return (keys.index(m.group(1)), int(m.group(2) or 0))


def _repaired(data: dict[str, Any], err: ValidationError) -> dict[str, Any] | None:
    """`data` with its broken independent fields and steps set aside, or None when a schema
    error sits in a table others refer to (then only the schema errors are reported)."""
    if any(_is_cross(e) for e in err.errors()):
        return None  # the cross-checks already ran
    fixed = copy.deepcopy(data)
    for e in err.errors():
        loc = e["loc"]
        if not loc:
            return None
        if e["type"] == "extra_forbidden":
            _drop_key(fixed, loc)  # an unknown key: without it, the table is what was meant
        elif loc[0] in _INDEPENDENT:
            fixed.pop(str(loc[0]), None)
        elif loc[0] in _STEP_LISTS and len(loc) > 1 and isinstance(loc[1], int):
            steps = fixed[str(loc[0])] = list(fixed[str(loc[0])])
            old = steps[loc[1]]
            observe = old.get("observe") if isinstance(old, dict) else None
            steps[loc[1]] = ({"kind": "collective", "op": "barrier", "observe": observe} if isinstance(observe, str)
                             else {"kind": "sleep", "seconds": 0})
        else:
            return None
    return fixed


def _drop_key(data: Any, loc: tuple[Any, ...]) -> None:
    """Remove the key at path `loc` (steps' kind tags skipped), where it still exists."""
    for part in loc[:-1]:
        if isinstance(data, dict) and part in data:
            data = data[part]
        elif isinstance(data, list) and isinstance(part, int) and part < len(data):
            data = data[part]
        elif part not in STEP_KINDS:
            return
    if isinstance(data, dict):
        data.pop(loc[-1], None)


def _is_cross(e: Any) -> bool:
    return isinstance(e.get("ctx", {}).get("error"), _FieldErrors)


def _format_validation_errors(err: ValidationError) -> list[str]:
    """One "field: message" line per problem, e.g. ``world_size: Input should be >= 1``;
    the several errors pydantic gives for one field of a union are one line."""
    by_loc: dict[str, list[str]] = {}
    union_types: set[str] = set()  # paths where a union member said "not my type"
    for e in err.errors():
        ctx_err = e.get("ctx", {}).get("error")
        if isinstance(ctx_err, _FieldErrors):
            for loc, msg in ctx_err.items:
                by_loc.setdefault(loc, []).append(msg)
            continue
        loc, msg = _one(e)
        if e["type"].endswith("_type") and any(_union_member(x) for x in e["loc"]):
            union_types.add(loc)
        by_loc.setdefault(loc, [])
        if msg not in by_loc[loc]:
            by_loc[loc].append(msg)
    for loc in union_types:  # the value has another member's type, whose own error is deeper: keep that one
        if any(other.startswith((f"{loc}.", f"{loc}[")) for other in by_loc):
            del by_loc[loc]
    lines = []
    for loc, msgs in by_loc.items():
        if len(msgs) > 1 and all(m.startswith("Input should be ") for m in msgs):  # a union's members
            msgs = [msgs[0] + "".join(f"; or {m[len('Input should be '):]}" for m in msgs[1:])]
        lines += [f"{loc}: {m}" for m in msgs]
    return lines


_FIELD_PREFIX = re.compile(r"^([A-Za-z_]\w*(?:\[\d+\])?): (.*)$")


def _one(e: Any) -> tuple[str, str]:
    """One pydantic error as (field path, message)."""
    parts: list[str | int] = [p for p in e["loc"] if p not in STEP_KINDS and not _union_member(p)]
    msg = e["msg"]
    if msg.startswith("Value error, "):
        msg = msg[len("Value error, "):]
        m = _FIELD_PREFIX.match(msg)  # a table's own validator names its field: "offset: ..."
        if m:
            parts.append(m.group(1))
            msg = m.group(2)
    msg = _TABLE.sub("a table", msg)
    if e["type"] == "extra_forbidden":
        msg = "unknown key"
    elif e["type"].endswith("_type") and "input" in e and not isinstance(e["input"], (dict, list)):
        msg += f", got {_brief(e['input'])}"  # strict types: say what was given ("2" is not 2)
    if e["type"] in ("union_tag_invalid", "union_tag_not_found"):  # a step's `kind`
        parts.append("kind")
        given = e["input"].get("kind") if isinstance(e.get("input"), dict) else None
        msg = (f"unknown step kind {given!r}" if given is not None else "missing") + f" (one of {', '.join(STEP_KINDS)})"
    return _path(parts), msg


def _brief(value: object) -> str:
    """A user's value, short: what a type error quotes."""
    text = repr(value)
    return f"{type(value).__name__} {text if len(text) <= 40 else text[:37] + '...'}"


_TABLE = re.compile(r"a valid dictionary(?: or (?:instance of \w+|object to extract fields from))?")
_UNION_MEMBER = re.compile(r"^(float|int|str|bool|(list|dict|literal|tuple|nullable)\[.*\]|function-.*|constrained-.*|ValueWhen)$")


def _union_member(part: object) -> bool:
    """Whether a pydantic error-path part names a union's member type, not a field."""
    return isinstance(part, str) and _UNION_MEMBER.match(part) is not None


def _path(parts: list[str | int]) -> str:
    out = ""
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else (f".{part}" if out else str(part))
    return out or "scenario"


def parse_scenario(data: dict[str, Any], source: str = "<dict>", target: Target = "sim") -> Scenario:
    """Validate a dict into a Scenario that `target` can run, raising ScenarioError with one
    line per problem ("SOURCE: FIELD: message"), every problem at once."""
    if not isinstance(data, dict):
        raise ScenarioError(f"{source}: a scenario is a table of keys, not {type(data).__name__}")
    check_data(data, source)
    s, lines = _problems(data)
    if s is None:
        raise ScenarioError("\n".join(f"{source}: {line}" for line in lines))
    check_target(s, target, source)
    return s


class _TomlJsonSchema(GenerateJsonSchema):
    """JSON schema for a TOML file: TOML has no null, so an optional key is one left out
    (no `null` branch, no `"default": null`)."""

    def nullable_schema(self, schema: core_schema.NullableSchema) -> JsonSchemaValue:
        return self.generate_inner(schema["schema"])

    def default_schema(self, schema: core_schema.WithDefaultSchema) -> JsonSchemaValue:
        js = super().default_schema(schema)
        if js.get("default", 0) is None:
            js.pop("default")
        return js


def json_schema() -> dict[str, Any]:
    """The scenario file's JSON schema (draft 2020-12), generated from the model: what
    `simdist schema` prints for editors (docs/scenarios.md, Editor support)."""
    body = Scenario.model_json_schema(by_alias=True, schema_generator=_TomlJsonSchema)
    return {"$schema": "https://json-schema.org/draft/2020-12/schema", **body, "title": "simdist scenario"}


def topology_problems(topo: Topology, world_size: int) -> list[str]:
    """What is wrong with `topo` for `world_size` ranks, one "field: message" per problem:
    the scenario's own topology checks (`crosscheck`), for a topology given apart from a
    scenario (a script's `--topology`, whose world size is known only once its ranks start)."""
    p = crosscheck.Problems()
    crosscheck.check_topology(p, topo, world_size)
    crosscheck.check_connected(p, topo, world_size)
    return [f"{loc}: {msg}" for loc, msg in p.items]


def load_topology(spec: str | Path) -> Topology:
    """A topology on its own (a script has no scenario file to hold one): a preset name, or a
    TOML file with a `[topology]` table as a scenario has (or that table's keys at the top).
    Bad input raises a one-line ScenarioError naming the field."""
    if str(spec) in PRESETS:
        return Topology(preset=str(spec))
    if not Path(spec).is_file():
        raise ScenarioError(f"topology: '{spec}' is neither a preset ({', '.join(PRESETS)}) nor a file")
    data = read_toml(spec, "topology")
    table = data.get("topology", data)
    if not isinstance(table, dict):
        raise ScenarioError(f"{spec}: topology: a table of keys, not {type(table).__name__}")
    try:
        return Topology.model_validate(table)
    except ValidationError as err:
        raise ScenarioError(f"{spec}: topology." + "; topology.".join(_format_validation_errors(err))) from None


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
