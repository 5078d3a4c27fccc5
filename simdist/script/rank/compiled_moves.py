"""Device moves inside a `torch.compile`d function on the simulated GPUs: traced whole, as on
a GPU, and what the compiled function returns is where a GPU run puts it.

Why: a GPU script's compiled step moves tensors (`x.to("cuda")`, `x.to(device)`, `.cuda()`,
`.cpu()`, `torch.ones(3, device="cuda")`) and a GPU compiles it in one graph. Here the moves
are the rank layer's replacements of torch's tensor methods (`devices._patch_tensor_moves`),
and two things broke that:

* dynamo lists the tensor methods it puts in a graph by reading `torch.Tensor`
  (`trace_rules.get_tensor_method`), where it found the replacements, so torch's own method
  the replacement calls was "a builtin Dynamo does not know how to trace": a graph break and
  a warning per move (4 graphs and 7 breaks in `tests/scripts/compiled_moves.py` before its
  `mixed`, where the CPU run compiles 2 and none), and
  `fullgraph=True` raised `Unsupported` (`know_tensor_methods`);
* in a graph every tensor is a CPU fake tensor, so a move to a simulated GPU is a move from
  the CPU to the CPU: no copy (an alias of its input, where a GPU copies), and which memory
  is a simulated GPU's is lost: inductor's kernels allocate their outputs where the rank
  layer never sees them, and `inductor_outputs` can only place a graph's outputs by its
  inputs, so the result of `x.to("cuda")` of a host `x` would be host memory to the script
  (`(y + 1).to(y.device)` of a GPU `y` was, when it ran eagerly after a break).

So a move in a traced function is a custom op, `simdist::place(x, index)` (`PLACE`: a copy of
`x` on simulated GPU `index`, -1 the host), which dynamo and inductor keep as an opaque call,
and when dynamo hands a graph with such a move to its backend, the device of each of the
graph's outputs is read off the graph (`output_sources`: the moves, and otherwise an op's
result is where its inputs are, the rank layer's rule for eager calls) and the outputs are
placed so at each call (`plan_outputs`).
"""

from __future__ import annotations

import functools
import threading
import types
from collections.abc import Callable, Sequence
from typing import Any

import torch

from simdist.script.rank import gpu_memory

HOST = -1  # `place`'s index for host memory

_LIB = "simdist"


def _place(x: torch.Tensor, index: int) -> torch.Tensor:
    """A copy of `x` on simulated GPU `index` (HOST: in host memory). Always a copy: in a graph
    the device a tensor is on is not known (every tensor is a CPU fake one), and a move that
    changes the device copies, which is what a graph's moves are for."""
    out = x.clone()
    return out if index == HOST else gpu_memory.mark(out, index)


def _define() -> Any:
    """`torch.ops.simdist.place.default`, defined once a process (a forked rank inherits it)."""
    if hasattr(torch.ops, _LIB) and hasattr(getattr(torch.ops, _LIB), "place"):
        return torch.ops.simdist.place.default
    op = torch.library.custom_op(f"{_LIB}::place", mutates_args=())(_place)

    @op.register_fake
    def _(x: torch.Tensor, index: int) -> torch.Tensor:
        return x.clone()

    def backward(ctx: Any, grad: torch.Tensor) -> tuple[torch.Tensor, None]:
        return grad, None  # (the leaves' gradients are placed on their GPU: `gpu_grads`)

    op.register_autograd(backward)
    return torch.ops.simdist.place.default


PLACE: Any = None  # set by `install`


# A graph's output is on the first simulated GPU among its sources: ("in", i), graph input i's
# device; ("gpu", k), simulated GPU k; ("graph", 0), the one GPU the graph's inputs are on (a
# factory given a device the graph shows as the CPU: `torch.arange(n, device=x.device)` reads
# the CPU of dynamo's fake tensors, and a GPU program makes it on its GPU); none of them on a
# GPU, host memory.
Source = tuple[str, int]
_GRAPH: Source = ("graph", 0)


def _is_place(node: Any) -> bool:
    return node.op == "call_function" and node.target in (PLACE, PLACE.overloadpacket)


def _like_tensor(node: Any) -> Any:
    """The tensor `x.to(other)` takes its device from (the FX node of `other`), else None."""
    if node.op == "call_method" and node.target == "to" and len(node.args) > 1:
        import torch.fx

        return node.args[1] if isinstance(node.args[1], torch.fx.Node) else None
    return None


def _node_sources(node: Any, known: dict[Any, tuple[Source, ...]]) -> tuple[Source, ...]:
    """The sources of an FX node's tensor result: a move's own device (`x.to(other)`:
    `other`'s), else its inputs' (in argument order, as `gpu_memory.input_index` reads an
    eager call's). A result of no tensor operand on a GPU (a host move's result, a factory) is
    host memory, unless the call names a device: a factory's `device=` left in a graph is a
    CPU device object (`device=x.device` reads the CPU of dynamo's fake tensors), which a GPU
    program places on its GPU: then the graph's GPU, `_GRAPH`."""
    if _is_place(node):
        index = node.args[1] if len(node.args) > 1 else node.kwargs.get("index", HOST)
        return () if index == HOST else (("gpu", int(index)),)
    like = _like_tensor(node)
    if like is not None:
        return known.get(like, ())
    found: list[Source] = []
    for arg in _flat_nodes((node.args, node.kwargs)):
        for source in known.get(arg, ()):
            if source not in found:
                found.append(source)
            if source[0] == "gpu":
                return tuple(found)
    return (*found, _GRAPH) if _given_a_device(node) else tuple(found)


def _given_a_device(node: Any) -> bool:
    """Whether a traced call names a device that the graph shows as a CPU device object (a
    factory's `device=`, `x.to(y.device)`): read off a tensor (dynamo's fake tensors are on the
    CPU), so on a GPU the device of the GPU tensors the program computes with. ("cpu" written
    out is a host move: `PLACE` follows the call.)"""
    return "device" in node.kwargs or (node.op == "call_method" and node.target == "to"
                                       and any(isinstance(a, torch.device) for a in node.args[1:]))


def _tensor_valued(node: Any) -> bool:
    """Whether a traced node's value is a tensor or several (`x.size(0)`, a SymInt, is not:
    `torch.zeros(x.size(0))` is host memory on a GPU); a node without dynamo's example value
    (a graph traced otherwise) counts as one."""
    if "example_value" not in node.meta:
        return True
    value = node.meta["example_value"]
    return isinstance(value, torch.Tensor) or (
        isinstance(value, (list, tuple)) and any(isinstance(v, torch.Tensor) for v in value))


def _flat_nodes(value: Any) -> list[Any]:
    import torch.fx

    out: list[Any] = []
    torch.fx.node.map_arg(value, out.append)
    return out


def output_sources(gm: Any) -> list[tuple[Source, ...] | None] | None:
    """Per output of a dynamo graph, its sources (None: not a node's value); None for a graph
    with no move in it (its outputs are placed as before: the eager calls' rule, and
    `inductor_outputs`)."""
    import torch.fx

    known: dict[Any, tuple[Source, ...]] = {}
    inputs = 0
    has_move = False
    outputs: Any = ()
    for node in gm.graph.nodes:
        if node.op == "placeholder":
            known[node] = (("in", inputs),)
            inputs += 1
        elif node.op in ("call_function", "call_method", "call_module"):
            has_move = has_move or _is_place(node) or _like_tensor(node) is not None or _given_a_device(node)
            known[node] = _node_sources(node, known) if _tensor_valued(node) else ()
        elif node.op == "output":
            outputs = node.args[0]
    if not has_move:
        return None
    flat = outputs if isinstance(outputs, (list, tuple)) else (outputs,)
    return [known.get(o) if isinstance(o, torch.fx.Node) else None for o in flat]


def _graph_gpu(args: Sequence[Any]) -> int | None:
    """The one simulated GPU the graph's tensor inputs are on (None: none, or several)."""
    found = {gpu_memory.gpu_index(a) for a in args} - {None}
    return found.pop() if len(found) == 1 else None


def _resolve(sources: tuple[Source, ...], args: Sequence[Any]) -> int | None:
    for kind, n in sources:
        if kind == "gpu":
            return n
        index = _graph_gpu(args) if kind == "graph" else (gpu_memory.gpu_index(args[n]) if n < len(args) else None)
        if index is not None:
            return index
    return None


class _Planned(threading.local):
    depth = 0


PLANNED = _Planned()  # inside a planned graph's call: `inductor_outputs` leaves its outputs to the plan


def _placing(compiled: Callable[..., Any], plan: list[tuple[Source, ...] | None]) -> Callable[..., Any]:
    @functools.wraps(compiled)
    def run(*args: Any) -> Any:
        PLANNED.depth += 1
        try:
            out = compiled(*args)
        finally:
            PLANNED.depth -= 1
        flat = out if isinstance(out, (list, tuple)) else (out,)
        with torch._C.DisableTorchFunction():  # (the layer's own reads: no call for a program's mode)
            for t, sources in zip(flat, plan, strict=False):  # (a plan covers every output)
                if sources and type(t) in gpu_memory.PLAIN:
                    index = _resolve(sources, args)
                    if index is not None:
                        gpu_memory.mark(t, index)
        return out

    return run


def plan_outputs(output_graph: Any) -> None:
    """Each graph dynamo compiles with a move in it places its outputs by `output_sources` at
    each call. Given `torch._dynamo.output_graph` once it is imported."""
    cls = output_graph.OutputGraph
    orig = cls.call_user_compiler

    @functools.wraps(orig)
    def call_user_compiler(self: Any, gm: Any, example_inputs: Any) -> Any:
        plan = output_sources(gm)  # (before the backend, which may rewrite the graph)
        compiled = orig(self, gm, example_inputs)
        return compiled if plan is None else _placing(compiled, plan)

    cls.call_user_compiler = call_user_compiler


def know_tensor_methods(trace_rules: Any) -> None:
    """Dynamo puts torch's own tensor methods in a graph (`TensorBase.to`, `.cpu`, ...) though
    `torch.Tensor` now holds the rank layer's replacements, as it does with torch as installed:
    its list (`get_tensor_method`, cached) is read off `torch.Tensor`, which inherits them from
    `torch._C.TensorBase`. Given `torch._dynamo.trace_rules` once it is imported."""
    orig = trace_rules.get_tensor_method

    @functools.cache
    def get_tensor_method() -> frozenset[Any]:
        base = {m for name, m in vars(torch._C.TensorBase).items()
                if isinstance(m, types.MethodDescriptorType) and name not in ("_make_subclass",
                                                                             "_make_wrapper_subclass")}
        return orig() | frozenset(base)

    trace_rules.get_tensor_method = get_tensor_method


def install() -> None:
    """Define the move op (`PLACE`), once."""
    global PLACE
    if PLACE is None:
        PLACE = _define()
