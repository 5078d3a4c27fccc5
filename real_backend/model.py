"""The chain model a scenario's `[model]` table describes.

One `nn.Parameter` per entry of `params` (1-D of that many elements, or of that shape) (registered in order as p0, p1, ...) and one
buffer per entry of `buffers` (b0, b1, ...). The forward pass adds every used parameter's
contribution in registration order::

    h = x; for p in used params: h = h + (p * x).sum()

so autograd produces gradients in reverse registration order, which is the order DDP's
reducer marks them ready (and the order the rebuilt buckets take).
"""

from __future__ import annotations

import torch
from torch import nn

from simdist.scenario import Model

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


class ChainModel(nn.Module):
    def __init__(self, spec: Model, device: torch.device | str = "cpu"):
        super().__init__()
        dtype = torch_dtype(spec.dtype)
        for i, n in enumerate(spec.params):
            shape = (n,) if isinstance(n, int) else tuple(n)  # an int is a 1-D parameter, a list a shape
            self.register_parameter(f"p{i}", nn.Parameter(torch.full(shape, 0.5, dtype=dtype, device=device)))
        for i, n in enumerate(spec.buffers):
            self.register_buffer(f"b{i}", torch.zeros(n, dtype=dtype, device=device))
        unused = set(spec.unused_params)
        self._used = [f"p{i}" for i in range(len(spec.params)) if i not in unused]

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        h = x
        for name in self._used:
            h = h + (getattr(self, name) * x).sum()
        return h
