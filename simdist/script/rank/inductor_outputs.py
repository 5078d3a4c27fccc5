"""What a graph compiled by inductor (`torch.compile`'s default backend) returns on the
simulated GPUs is on their GPU, as a GPU graph's kernels write their outputs there.

Why: on simulated GPUs inductor compiles CPU kernels (`gpu_shims.is_available`), and the
buffers its generated code allocates (`empty_strided_cpu`) never pass the rank layer's
`TorchFunctionMode`, which is what places an operation's results on its inputs' GPU
(`devices.CudaToCpu`, `gpu_memory`). Only the results of the torch calls the generated code
makes (`extern_kernels.mm`, ...) were placed, so a compiled loss (`(o ** 2).mean()`) was host
memory to the script: `loss.device` "cpu" where a GPU says `cuda:0`, `.numpy()` of it allowed
where a GPU raises, uncounted by `torch.cuda.memory_allocated`. The eager backends ("eager",
"aot_eager") run torch calls, which the mode sees.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence
from typing import Any

import torch

from simdist.script.rank import compiled_moves, gpu_memory


def graph_gpu(inputs: Sequence[Any]) -> tuple[int | None, list[Any]]:
    """The simulated GPU a compiled graph runs on: the one its tensor inputs are on (host
    scalars, 0-dim, may be among them, as in a GPU program), and those host scalars'
    storages (an output on one stays host memory; held, so that none is freed meanwhile).
    None if none is on a GPU, or a host tensor of more dimensions or a second GPU is among
    them (a graph that mixes devices: which output is on which is not known here)."""
    index: int | None = None
    host: list[Any] = []
    with torch._C.DisableTorchFunction():  # (the layer's own reads: no torch call for a program's mode)
        for t in inputs:
            if type(t) not in gpu_memory.PLAIN:
                continue
            here = gpu_memory.gpu_index(t)
            if here is None:
                if t.dim() != 0:
                    return None, host
                host.append(t.untyped_storage())
            elif index is None:
                index = here
            elif here != index:
                return None, host
    return index, host


def _place(out: Any, index: int, host: list[Any]) -> None:
    """Each tensor result not on a host scalar input's memory is on GPU `index`."""
    for t in out if isinstance(out, (list, tuple)) else (out,):
        if type(t) not in gpu_memory.PLAIN:
            continue
        try:
            storage = t.untyped_storage()
        except (RuntimeError, NotImplementedError):  # sparse, nested: no storage of their own
            continue
        if not any(storage is s for s in host):
            gpu_memory.mark(t, index)


def place_outputs_on_gpu(output_code: Any) -> None:
    """The tensor results of each call of an inductor graph (`CompiledFxGraph`: a forward, a
    backward, an inference graph) are on the GPU its inputs are on (`graph_gpu`); those
    already on one (an alias of an input, a torch call's result) stay there. Given
    `torch._inductor.output_code` once it is imported."""
    cls = output_code.CompiledFxGraph
    orig = cls.__call__

    @functools.wraps(orig)
    def __call__(self: Any, inputs: Sequence[Any]) -> Any:
        index, host = graph_gpu(inputs)  # (before the call: inductor's calling convention empties `inputs`)
        out = orig(self, inputs)
        if index is not None and not compiled_moves.PLANNED.depth:  # (a graph with moves: its plan places them)
            with torch._C.DisableTorchFunction():
                _place(out, index, host)
        return out

    cls.__call__ = __call__
