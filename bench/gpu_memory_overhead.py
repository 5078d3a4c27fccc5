"""Benchmark: what the simulated GPUs' device propagation costs a DDP training loop.

The rank layer's `CudaToCpu` mode sees every torch call a script's Python makes; since the
device became a property of the storage (`simdist.script.rank.gpu_memory`), it also reads
the first tensor argument's storage and marks the results of calls on GPU tensors. This
runs one process's DDP training step (a 1-rank Gloo group, so DDP's own Python and its
reducer run as in a script) on "cuda", three ways, alternating, CPU time of the
thread that runs it (`time.thread_time`, torch on one thread: `torch.set_num_threads(1)`):

* `plain`: no rank layer at all (the CPU path of the same program);
* `remap`: the rank layer with propagation turned off (what the mode cost before);
* `noview`: the rank layer with torch's own `Tensor.device`/`is_cuda`/`is_cpu`/`get_device`/
  `type` (without `simdist.script.rank.device_view`, which asks who reads them);
* `noalloc`: the rank layer as installed but for the simulated allocator
  (`simdist.script.rank.gpu_allocator`: a storage placed on a GPU is only tagged);
* `device`: the rank layer as installed (remap, propagation, device view, allocator).

    python bench/gpu_memory_overhead.py [--steps 200] [--rounds 5] [--hidden 64 512]
"""

from __future__ import annotations

import argparse
import contextlib
import time
from collections.abc import Iterator

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP

from simdist.script.rank import device_view, devices, gpu_memory


def _model(hidden: int, device: str) -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(32, hidden), nn.ReLU(), nn.Linear(hidden, hidden), nn.ReLU(),
                         nn.Linear(hidden, 1)).to(device)


def _steps(hidden: int, device: str, steps: int) -> float:
    """CPU seconds per step of a DDP training loop (Adam, a batch moved to `device` each step)."""
    model = DDP(_model(hidden, device))
    opt = torch.optim.Adam(model.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(0)
    x, y = torch.randn(steps, 16, 32, generator=g), torch.randn(steps, 16, 1, generator=g)
    start = time.thread_time()
    for i in range(steps):
        xb, yb = x[i].to(device), y[i].to(device)
        loss = nn.functional.mse_loss(model(xb), yb)
        opt.zero_grad()
        loss.backward()
        opt.step()
        loss.item()
    return (time.thread_time() - start) / steps


@contextlib.contextmanager
def _without_propagation() -> Iterator[None]:
    orig = gpu_memory.input_index
    gpu_memory.input_index = lambda args: None  # type: ignore[assignment]
    try:
        yield
    finally:
        gpu_memory.input_index = orig  # type: ignore[assignment]


@contextlib.contextmanager
def _without_device_view() -> Iterator[None]:
    views = {name: torch.Tensor.__dict__[name] for name in device_view.VIEWS}
    for name in views:
        delattr(torch.Tensor, name)  # torch's own (TensorBase's) again
    try:
        yield
    finally:
        for name, view in views.items():
            setattr(torch.Tensor, name, view)


@contextlib.contextmanager
def _without_accounting() -> Iterator[None]:
    orig = gpu_memory._place

    def tag_only(storage: object, index: int) -> None:
        setattr(storage, gpu_memory._ATTR, index)

    gpu_memory._place = tag_only  # type: ignore[assignment]
    try:
        yield
    finally:
        gpu_memory._place = orig  # type: ignore[assignment]


def main() -> None:
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, default=200)
    p.add_argument("--rounds", type=int, default=5)
    p.add_argument("--hidden", type=int, nargs="+", default=[64, 512])
    a = p.parse_args()
    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    devices.install(1)
    mode = devices._MODE
    for hidden in a.hidden:
        best = dict.fromkeys(("plain", "remap", "noview", "noalloc", "device"), float("inf"))
        for _ in range(a.rounds):
            mode.__exit__(None, None, None)
            try:
                with _without_device_view():
                    best["plain"] = min(best["plain"], _steps(hidden, "cpu", a.steps))
            finally:
                mode.__enter__()
            with _without_propagation(), _without_device_view():
                best["remap"] = min(best["remap"], _steps(hidden, "cuda", a.steps))
            with _without_device_view():
                best["noview"] = min(best["noview"], _steps(hidden, "cuda", a.steps))
            with _without_accounting():
                best["noalloc"] = min(best["noalloc"], _steps(hidden, "cuda", a.steps))
            best["device"] = min(best["device"], _steps(hidden, "cuda", a.steps))
        print(f"hidden {hidden}: CPU us/step plain {best['plain'] * 1e6:.0f}  remap {best['remap'] * 1e6:.0f}  "
              f"noview {best['noview'] * 1e6:.0f}  noalloc {best['noalloc'] * 1e6:.0f}  device {best['device'] * 1e6:.0f}  "
              f"device/noalloc {best['device'] / best['noalloc']:.3f}  "
              f"device/noview {best['device'] / best['noview']:.3f}  device/remap {best['device'] / best['remap']:.3f}  "
              f"device/plain {best['device'] / best['plain']:.3f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
