"""The chain model a scenario's `[model]` table describes.

One `nn.Parameter` per entry of `params` (1-D of that many elements, or of that shape) (registered in order as p0, p1, ...) and one
buffer per entry of `buffers` (b0, b1, ...). The forward pass adds every used parameter's
contribution in registration order::

    h = x; for p in used params: h = h + (p * x).sum()

so autograd produces gradients in reverse registration order, which is the order DDP's
reducer marks them ready (and the order the rebuilt buckets take).

A model built with `busy=True` (its scenario gives a `backward` step `seconds`) puts a
`_Busy` node after each parameter's term: in backward it sleeps the parameter's share of
the step's seconds (`simdist.torchmodels.ddp.backward_shares`, set per step with
`set_backward_seconds`) before the gradient flows on to the parameter, so each gradient
becomes ready, and DDP launches its buckets, as the backward proceeds.
"""

from __future__ import annotations

import time

import torch
from torch import nn

from simdist.scenario import Model
from simdist.torchmodels.ddp import backward_shares

_DTYPES: dict[str, torch.dtype] = {
    "float32": torch.float32,
    "float64": torch.float64,
    "float16": torch.float16,
    "bfloat16": torch.bfloat16,
    "int64": torch.int64,
    "int32": torch.int32,
    "int16": torch.int16,
    "int8": torch.int8,
    "uint8": torch.uint8,
    "bool": torch.bool,
}


def torch_dtype(name: str) -> torch.dtype:
    return _DTYPES[name]


class _Busy(torch.autograd.Function):
    """Identity forward; the backward sleeps `shares[i]` seconds before passing the gradient on."""

    @staticmethod
    def forward(ctx, t: torch.Tensor, shares: list[float], i: int) -> torch.Tensor:  # type: ignore[override]
        ctx.shares, ctx.i = shares, i
        return t.clone()

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> tuple[torch.Tensor, None, None]:  # type: ignore[override]
        if ctx.shares[ctx.i] > 0:
            time.sleep(ctx.shares[ctx.i])
        return grad, None, None


class ChainModel(nn.Module):
    def __init__(self, spec: Model, device: torch.device | str = "cpu", busy: bool = False):
        super().__init__()
        dtype = torch_dtype(spec.dtype)
        for i, n in enumerate(spec.params):
            shape = (n,) if isinstance(n, int) else tuple(n)  # an int is a 1-D parameter, a list a shape
            self.register_parameter(f"p{i}", nn.Parameter(torch.full(shape, 0.5, dtype=dtype, device=device)))
        for i, n in enumerate(spec.buffers):
            self.register_buffer(f"b{i}", torch.zeros(n, dtype=dtype, device=device))
        unused = set(spec.unused_params)
        self._used = [f"p{i}" for i in range(len(spec.params)) if i not in unused]
        self._numels = spec.numels()
        self._is_used = [i not in unused for i in range(len(spec.params))]
        self.busy = busy  # backward sleeps its shares (set_backward_seconds)
        self._shares = [0.0] * len(spec.params)  # read by the _Busy nodes when backward runs

    def set_backward_seconds(self, seconds: float) -> None:
        """The next backward computes for `seconds` (needs `busy=True` when > 0)."""
        self._shares[:] = backward_shares(self._numels, self._is_used, seconds)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for name in self._used:
            term = (getattr(self, name) * x).sum()
            h = h + (_Busy.apply(term, self._shares, int(name[1:])) if self.busy else term)
        return h
