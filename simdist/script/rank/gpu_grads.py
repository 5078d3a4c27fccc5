"""Gradients are on their parameter's simulated GPU as soon as backward made them.

Why: autograd makes a leaf's `.grad` in C++ (`AccumulateGrad`), where the rank layer's
`TorchFunctionMode` does not see it, so a gradient was placed on its GPU (`gpu_memory`) only
when Python first read `p.grad` (the mode sees that read): `torch.cuda.memory_allocated()`
printed right after `loss.backward()` left out every gradient (a 2.1 MB MLP: 2.17 MB after
backward, 4.27 MB once the grads were read; on a GPU the grads are allocated by then).

How: `torch.autograd.backward` (which `Tensor.backward` calls) first walks the graph from the
tensors it differentiates to the leaves it accumulates into (`AccumulateGrad.variable`, or
`inputs=`), runs, then places each leaf's `.grad` on the leaf's GPU; `torch.autograd.grad`'s
results are placed on their inputs' GPUs. No hook is registered on any tensor (a
post-accumulate-grad hook is visible to torch: FSDP2 picks a blocking copy for a parameter
that has one). The bound that stays: a gradient exists on a GPU from the moment its
`AccumulateGrad` runs, here from the end of backward, so the peak during backward (saved
activations still alive beside the first grads) is not reached; and what torch's C++ makes
besides (DDP's buckets, saved activations of C++ ops) is not counted.
"""

from __future__ import annotations

import functools
from collections.abc import Iterable
from typing import Any

import torch

from simdist.script.rank import gpu_allocator, gpu_memory


def _as_list(tensors: Any) -> list:
    if tensors is None:
        return []
    if isinstance(tensors, (torch.Tensor, torch.autograd.graph.GradientEdge)):
        return [tensors]
    return list(tensors)


def leaves(outputs: Iterable[Any]) -> list[torch.Tensor]:
    """The leaf tensors whose gradients a backward from `outputs` accumulates (each once).
    The nodes visited are kept until the walk ends: a node's Python object may be made anew
    on each `next_functions` read, and a freed one's `id` reused by the next."""
    visited: dict[int, Any] = {}
    found: list[torch.Tensor] = []
    todo = [t.grad_fn for t in outputs if isinstance(t, torch.Tensor) and t.grad_fn is not None]
    for t in outputs:
        if isinstance(t, torch.Tensor) and t.grad_fn is None and t.requires_grad:
            found.append(t)  # a leaf differentiated itself
    while todo:
        node = todo.pop()
        if node is None or id(node) in visited:
            continue
        visited[id(node)] = node
        if type(node).__name__ == "AccumulateGrad":
            found.append(node.variable)
        else:
            todo.extend([nxt for nxt, _ in node.next_functions])
    return found


def place_grads(tensors: Iterable[torch.Tensor]) -> None:
    """Each tensor's `.grad` on the tensor's simulated GPU, if it is on one (`gpu_memory`)."""
    for t in tensors:
        index = gpu_memory.gpu_index(t)
        if index is not None:
            grad = t.grad
            if grad is not None and gpu_memory.gpu_index(grad) is None:
                gpu_memory.mark(grad, index)


def install() -> None:
    """`torch.autograd.backward` and `torch.autograd.grad` place the gradients they make
    (module docstring). Once per process (`gpu_memory.install`)."""
    orig_backward, orig_grad = torch.autograd.backward, torch.autograd.grad

    @functools.wraps(orig_backward)
    def backward(tensors: Any, *args: Any, inputs: Any = None, **kwargs: Any) -> Any:
        if torch.compiler.is_compiling() or not gpu_allocator.used():  # (a traced graph, a CPU program: nothing)
            return orig_backward(tensors, *args, inputs=inputs, **kwargs)
        targets = [t for t in _as_list(inputs) if isinstance(t, torch.Tensor)] if inputs is not None \
            else leaves(_as_list(tensors))
        out = orig_backward(tensors, *args, inputs=inputs, **kwargs)
        place_grads(targets)
        return out

    @functools.wraps(orig_grad)
    def grad(outputs: Any, inputs: Any, *args: Any, **kwargs: Any) -> Any:
        out = orig_grad(outputs, inputs, *args, **kwargs)
        if torch.compiler.is_compiling():
            return out
        for source, result in zip(_as_list(inputs), out, strict=False):  # (torch checks the lengths)
            index = gpu_memory.gpu_index(source) if isinstance(source, torch.Tensor) else None
            if index is not None and result is not None and gpu_memory.gpu_index(result) is None:
                gpu_memory.mark(result, index)
        return out

    torch.autograd.backward = backward  # type: ignore[assignment]
    torch.autograd.grad = grad  # type: ignore[assignment]
