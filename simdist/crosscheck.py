"""Checks that need the whole scenario: names that resolve, ranks in range, tables that agree.

The schema (`simdist.schema`) checks each table on its own; what one table says about
another (a step's group, a model's name in `[join]`, a flag naming an observed result) is
checked here, against the scenario's symbol table (`Names`). Every problem is collected,
not just the first: a user editing a file by hand sees all that is wrong with it at once,
each as one line naming its field (`loop[2].group: unknown group 'evens'`).
`simdist.scenario` builds the table, runs the checks and turns the problems into errors.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, field

import networkx as nx

from simdist.collectives.algorithms import resolve as resolve_algorithm
from simdist.errors import ScenarioError
from simdist.limits import MAX_WORLD_SIZE
from simdist.schema import (
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
    StopStep,
    Topology,
    ValueWhen,
    When,
)
from simdist.vocab import BITWISE_REDUCE_OPS, JOIN_KWARGS, PRESET_MAX_WORLD, PRESETS, ROOTED_OPS, WORLD, fill_fits

ZERO = "zero"  # how [join] names the ZeRO optimizer (vocab.MODEL_JOINABLES)


@dataclass
class Problems:
    """Every problem found, in file order: (field path, message)."""

    items: list[tuple[str, str]] = field(default_factory=list)

    def add(self, loc: str, msg: str) -> None:
        self.items.append((loc, msg))


@dataclass(frozen=True)
class Names:
    """What the scenario's names resolve to: the table every cross-check reads."""

    world_size: int
    groups: dict[str, list[int]]  # group name -> its ranks, sorted (WORLD included)
    models: dict[str, Model]  # [model] and [[models]], by name
    joinables: dict[str, JoinableDecl]  # [[joinables]], by name
    optimizer: Optimizer | None
    observed: dict[str, list[Step]]  # observe name -> the steps that record it

    def rank_ok(self, r: int) -> bool:
        return 0 <= r < self.world_size


def names_of(p: Problems, world_size: int, groups: list[Group], model: Model | None, models: list[Model],
             joinables: list[JoinableDecl], optimizer: Optimizer | None, steps: list[Step]) -> Names:
    """The symbol table, reporting duplicate or reserved names and ranks out of range on the way."""
    table: dict[str, list[int]] = {WORLD: list(range(world_size))}
    for gi, g in enumerate(groups):
        if g.name in table:
            p.add(f"groups[{gi}].name", f"duplicate group name '{g.name}'")
            continue
        table[g.name] = sorted(g.ranks)
        for r in g.ranks:
            if not 0 <= r < world_size:
                p.add(f"groups[{gi}].ranks", f"rank {r} out of range for world_size {world_size}")
        if len(set(g.ranks)) != len(g.ranks):
            p.add(f"groups[{gi}].ranks", "duplicate rank")
    by_name: dict[str, Model] = {}
    located = ([("model", model)] if model is not None else []) + [(f"models[{k}]", m) for k, m in enumerate(models)]
    for loc, m in located:
        if m.name in by_name or m.name == ZERO:
            p.add(f"{loc}.name", f"duplicate or reserved model name '{m.name}'")
        by_name.setdefault(m.name, m)
        if m.group not in table:
            p.add(f"{loc}.group", f"unknown group '{m.group}'")
    custom: dict[str, JoinableDecl] = {}
    for ji, j in enumerate(joinables):
        if j.name in custom or j.name in by_name or j.name == ZERO:
            p.add(f"joinables[{ji}].name", f"duplicate or reserved joinable name '{j.name}'")
        custom.setdefault(j.name, j)
        if j.group not in table:
            p.add(f"joinables[{ji}].group", f"unknown group '{j.group}'")
    observed: dict[str, list[Step]] = {}
    for st in steps:
        if isinstance(st, (CollectiveStep, P2PStep)) and st.observe:
            observed.setdefault(st.observe, []).append(st)
    return Names(world_size, table, by_name, custom, optimizer, observed)


def check_inputs(p: Problems, inputs: Inputs, world_size: int) -> None:
    counts = inputs.per_rank(world_size)
    if len(counts) != world_size:
        p.add("inputs.counts", f"has {len(counts)} entries but world_size is {world_size}")
    for r, c in enumerate(counts):
        if c < 0:
            p.add("inputs", f"rank {r} gets {c} inputs (base + offset * rank must be >= 0)")


def check_optimizer(p: Problems, n: Names) -> None:
    """Its models exist; ZeRO has a model, a known group, and parameters on every rank of it."""
    opt = n.optimizer
    if opt is None:
        return
    for k, name in enumerate(opt.models or []):
        if name not in n.models:
            p.add(f"optimizer.models[{k}]", f"unknown model '{name}'")
    if not opt.zero:
        if opt.group is not None:
            p.add("optimizer.group", "only ZeroRedundancyOptimizer (zero = true) takes a process group")
        return
    if not n.models:
        p.add("optimizer.zero", "ZeroRedundancyOptimizer needs a [model] table")
        return
    mine = [n.models[m] for m in (opt.models or n.models) if m in n.models]
    group = zero_group(opt, mine)
    if group is None:
        p.add("optimizer.group", f"its models are on groups {sorted({m.group for m in mine})}: name ZeRO's group")
    elif group not in n.groups:
        if opt.group is not None:  # else its models' group is unknown, and named as theirs
            p.add("optimizer.group", f"unknown group '{group}'")
    else:
        holders = {r for m in mine for r in n.groups.get(m.group, [])}
        bare = [r for r in n.groups[group] if r not in holders]
        if bare:
            p.add("optimizer.group", f"ranks {bare} of group '{group}' hold none of its models (ZeRO would get no "
                                     "parameters there)")


def zero_group(opt: Optimizer, models: list[Model]) -> str | None:
    """ZeRO's process group: the one named, else the group its models share (None if they do not)."""
    if opt.group is not None:
        return opt.group
    groups = {m.group for m in models}
    return groups.pop() if len(groups) == 1 else (WORLD if not groups else None)


def check_join(p: Problems, n: Names, join: JoinBlock | None) -> None:
    if join is None:
        return
    for k, name in enumerate(join.joinables):
        if name == ZERO:
            if not (n.optimizer and n.optimizer.zero):
                p.add(f"join.joinables[{k}]", "'zero' needs [optimizer] with zero = true")
        elif name == "ddp" and not n.models:
            p.add(f"join.joinables[{k}]", "'ddp' needs a [model] table")
        elif name not in n.models and name not in n.joinables:
            p.add(f"join.joinables[{k}]", f"unknown joinable '{name}'")
    if len(set(join.joinables)) != len(join.joinables):
        p.add("join.joinables", "a joinable is listed twice")
    for k, v in join.kwargs.items():  # the kwargs the models read must have their type; others pass
        want = JOIN_KWARGS.get(k)
        if want is bool and not isinstance(v, bool):
            p.add(f"join.kwargs.{k}", "must be true or false")
        if want is int and (isinstance(v, bool) or not isinstance(v, int) or v < 0):
            p.add(f"join.kwargs.{k}", "must be a whole number >= 0")


def conditions(c: When, loc: str) -> Iterator[tuple[str, When]]:
    """(path, condition) for `c` and every condition nested in it, as errors name them."""
    yield loc, c
    if c.not_ is not None:
        yield from conditions(c.not_, f"{loc}.not")
    for k, sub in enumerate(c.any_ or []):
        yield from conditions(sub, f"{loc}.any[{k}]")


def _check_conditions(p: Problems, n: Names, c: When, loc: str, section: str) -> None:
    """Ranks in range, flags that name an observed result, no iteration after the loop."""
    for path, part in conditions(c, loc):
        for r in part.ranks or []:
            if not n.rank_ok(r):
                p.add(f"{path}.ranks", f"rank {r} out of range for world_size {n.world_size}")
        if part.flag is not None:
            _check_flag(p, n, part.flag, f"{path}.flag")
    if section == "after" and c.uses_iteration():
        p.add(loc, "iteration conditions (every/offset/below/from_iteration) make no sense after the loop")


def _check_flag(p: Problems, n: Names, name: str, loc: str) -> None:
    steps = n.observed.get(name)
    if not steps:
        p.add(loc, f"no step observes '{name}' (a flag reads the latest result a step records with observe)")
        return
    for st in steps:
        if isinstance(st, CollectiveStep) and st.async_op and st.wait != "now":
            p.add(loc, f"'{name}' is observed by an async collective waited {st.wait!r}: a flag needs a result "
                       "that is there when the next step runs (wait = \"now\")")
            return


def check_steps(p: Problems, n: Names, section: str, steps: list[Step], counts: list[int] | None = None) -> None:
    """Every step's conditions, references and values (`counts`: the ranks' input counts, which
    bound what `value = "iteration"` takes; None skips the value checks)."""
    for i, st in enumerate(steps):
        loc = f"{section}[{i}]"
        if isinstance(st, (CollectiveStep, P2PStep)) and counts is not None:
            _check_value(p, n, st, section, loc, counts)
        _check_conditions(p, n, st, loc, section)
        value = getattr(st, "value", None)
        if isinstance(value, ValueWhen):
            _check_conditions(p, n, value.when, f"{loc}.value.when", section)
        if isinstance(st, StopStep) and section == "after":
            p.add(f"{loc}.kind", "'stop' leaves the loop: it belongs in [[loop]]")
        if isinstance(st, (ComputeStep, SleepStep, BackwardStep)) and isinstance(st.seconds, list) and len(st.seconds) != n.world_size:
            p.add(f"{loc}.seconds", f"has {len(st.seconds)} entries but world_size is {n.world_size}")
        if isinstance(st, (ForwardStep, BackwardStep)):
            _check_model_ref(p, n, st, loc)
        if isinstance(st, OptimizerStep) and n.optimizer is None:
            p.add(f"{loc}.kind", "'optimizer_step' needs an [optimizer] table")
        if isinstance(st, JoinableCallStep) and st.joinable not in n.joinables:
            p.add(f"{loc}.joinable", f"unknown joinable '{st.joinable}'")
        if isinstance(st, CollectiveStep):
            _check_collective(p, n, st, loc)
        if isinstance(st, P2PStep):
            _check_p2p(p, n, st, loc)


def _fill_values(n: Names, st: CollectiveStep | P2PStep, section: str, counts: list[int]) -> list[float | int]:
    """The extreme values a step's `value` takes (what torch.full must accept); a
    conditional value takes those of both its branches."""
    if isinstance(st, P2PStep):
        ranks = [st.src]
    else:
        ranks = [r for r in n.groups.get(st.group, []) if st.ranks is None or r in st.ranks]
    last = -1 if section == "after" else max(counts, default=0) - 1
    if st.below is not None and section != "after":
        last = min(last, st.below - 1)
    values = [st.value.then, st.value.else_] if isinstance(st.value, ValueWhen) else [st.value]
    out: list[float | int] = []
    for v in values:
        if v == "rank":
            out += [min(ranks), max(ranks)] if ranks else []
        elif v == "iteration":
            out += [-1] if section == "after" else ([0, last] if last >= 0 else [])  # -1: interpret's after
        elif isinstance(v, (int, float)):
            out.append(v)
    return out


def _check_value(p: Problems, n: Names, st: CollectiveStep | P2PStep, section: str, loc: str,
                 counts: list[int]) -> None:
    for v in _fill_values(n, st, section, counts):
        if not fill_fits(v, st.dtype):
            what = f"{st.value} = {v}" if isinstance(st.value, str) else f"{v}"  # "rank = 300"
            p.add(f"{loc}.value", f"{what} does not fit {st.dtype} (torch.full raises: value cannot "
                                  f"be converted to type {st.dtype} without overflow)")
            return


def _check_model_ref(p: Problems, n: Names, st: ForwardStep | BackwardStep, loc: str) -> None:
    if not n.models:
        p.add(f"{loc}.kind", f"'{st.kind}' needs a [model] table")
    elif st.model is None and len(n.models) > 1:
        p.add(f"{loc}.model", f"there are {len(n.models)} models ({', '.join(n.models)}): name one")
    elif st.model is not None and st.model not in n.models:
        p.add(f"{loc}.model", f"unknown model '{st.model}'")


def _check_collective(p: Problems, n: Names, st: CollectiveStep, loc: str) -> None:
    if st.group not in n.groups:
        p.add(f"{loc}.group", f"unknown group '{st.group}'")
        return
    members = n.groups[st.group]
    if st.op in ROOTED_OPS and st.root not in members:
        p.add(f"{loc}.root", f"rank {st.root} is not in group '{st.group}'")
    if st.ranks is not None and not {r for r in st.ranks if n.rank_ok(r)} <= set(members):
        p.add(f"{loc}.ranks", f"ranks {st.ranks} are not all in group '{st.group}'")
    if st.op in ("reduce_scatter", "scatter", "all_to_all") and members and st.numel % len(members):
        p.add(f"{loc}.numel", f"{st.op} needs numel divisible by the group size {len(members)}")
    if st.reduce_op in BITWISE_REDUCE_OPS and st.dtype.startswith(("float", "bfloat")):
        p.add(f"{loc}.reduce_op", f"{st.reduce_op} needs an integer dtype, not {st.dtype}")
    if not st.async_op and st.wait != "now":
        p.add(f"{loc}.wait", "only async collectives can wait later")


def _check_p2p(p: Problems, n: Names, st: P2PStep, loc: str) -> None:
    for fld in ("src", "dst"):
        r = getattr(st, fld)
        if not n.rank_ok(r):
            p.add(f"{loc}.{fld}", f"rank {r} out of range for world_size {n.world_size}")
    if st.src == st.dst:
        p.add(f"{loc}.dst", "a rank cannot send to itself")
    if st.blocking and st.wait != "now":
        p.add(f"{loc}.wait", "only non-blocking p2p can wait later")


def check_expect(p: Problems, e: Expect | None, w: int) -> None:
    if e is None:
        return
    for fld in ("inputs_processed", "status", "collectives"):
        v = getattr(e, fld)
        if v is not None and len(v) != w:
            p.add(f"expect.{fld}", f"has {len(v)} entries but world_size is {w}")
    for k in e.errors:
        if not k.isdigit() or int(k) >= w:
            p.add(f"expect.errors.{k}", f"not a rank of world_size {w}")
    for k, v in e.observed.items():
        if len(v) != w:
            p.add(f"expect.observed.{k}", f"has {len(v)} entries but world_size is {w}")


def check_topology(p: Problems, t: Topology, w: int) -> None:
    """Everything the cost model would otherwise reject only when the run starts: preset,
    algorithms, profile file, nodes and links."""
    _check_cost_model(p, t)
    if t.preset is not None:
        if t.preset not in PRESETS:
            p.add("topology.preset", f"unknown preset '{t.preset}' (choose from {', '.join(PRESETS)})")
        elif w > PRESET_MAX_WORLD.get(t.preset, MAX_WORLD_SIZE):
            p.add("topology.preset", f"{t.preset} has {PRESET_MAX_WORLD[t.preset]} GPUs, world_size {w} does not fit")
        return
    node_names: set[str] = set()
    for i, nd in enumerate(t.nodes):
        if nd.name in node_names:
            p.add(f"topology.nodes[{i}].name", f"duplicate node '{nd.name}'")
        node_names.add(nd.name)
    for li, link in enumerate(t.links):
        if link.a == link.b:
            p.add(f"topology.links[{li}]", "a link joins two different nodes")
    for li, link in enumerate(t.links):
        for end in ("a", "b"):
            if getattr(link, end) not in node_names:
                p.add(f"topology.links[{li}].{end}", f"unknown node '{getattr(link, end)}'")
    placed = [r for nd in t.nodes for r in nd.ranks]
    for r in placed:
        if not 0 <= r < w:
            p.add("topology.nodes", f"rank {r} out of range for world_size {w}")
    missing = sorted(set(range(w)) - set(placed))
    if missing:
        p.add("topology.nodes", f"ranks {missing} are not placed on any node")
    if len(placed) != len(set(placed)):
        p.add("topology.nodes", "a rank is placed on two nodes")


def _check_cost_model(p: Problems, t: Topology) -> None:
    """The algorithms and the profile a topology names must be ones the cost model can load."""
    for op, algo in t.algorithms.items():
        try:
            resolve_algorithm(op, algo, f"topology.algorithms.{op}")
        except ScenarioError as e:
            loc, _, msg = str(e).partition(": ")
            p.add(loc, msg)
    if t.profile is not None:
        # Imported here: loading `simdist.network` loads simpy, which only a scenario that
        # names a calibrated profile needs to pay for at load time.
        from simdist.network.profile import load_profile

        try:
            load_profile(t.profile)
        except ScenarioError as e:
            loc, _, msg = str(e).partition(": ")
            p.add(loc, msg)


def check_connected(p: Problems, t: Topology, w: int) -> None:
    """Every rank's node reaches rank 0's over the links (when every rank is placed once)."""
    if t.preset is not None or not t.nodes:
        return
    where = {r: nd.name for nd in t.nodes for r in nd.ranks}
    if sorted(where) != list(range(w)) or len([r for nd in t.nodes for r in nd.ranks]) != w:
        return  # placement problems are reported already
    graph = nx.Graph()
    graph.add_nodes_from(nd.name for nd in t.nodes)
    graph.add_edges_from((link.a, link.b) for link in t.links if link.a in graph and link.b in graph)
    reach = nx.node_connected_component(graph, where[0])
    lost = sorted(r for r in range(w) if where[r] not in reach)
    if lost:
        p.add("topology.links", f"ranks {lost} cannot reach rank 0 (the topology is disconnected)")
