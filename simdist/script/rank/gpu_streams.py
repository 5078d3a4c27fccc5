"""CUDA streams and events on the simulated GPUs (`torch.cuda.Stream`, `torch.cuda.Event`).

Why a module of its own: a CPU's work is done when it is issued, so a stream has nothing to wait
for (torch.distributed.checkpoint's writer overlaps copies on the current stream once CUDA is
available, FSDP2 orders its all-gathers by events, scripts make side streams for overlap), but
an event made with `enable_timing=True` is how GPU scripts time their steps
(`start.record(); ...; end.record(); start.elapsed_time(end)`): its answer was always 0.0 ms, so
a script printing tokens a second printed 0, and one dividing by it raised ZeroDivisionError
where a GPU's run goes on. An event now records the script's clock when it is recorded (the
work before it is done by then, as on a GPU once it is synchronised), and `elapsed_time` is
the milliseconds between two records, with torch's errors for an event made without timing
or not recorded (ATen/cuda/CUDAEvent.h: ValueError, the timing check first).
"""

from __future__ import annotations

import time
from typing import Any

import torch

from simdist.script.rank.visible_gpus import Gpus


class Stream:
    """A CUDA stream on the CPU: nothing to wait for (module docstring)."""

    device_type = "cuda"

    def __init__(self, *args: Any, **kwargs: Any):
        self.device = torch.device("cuda", Gpus.current)

    def synchronize(self) -> None:
        return None

    def query(self) -> bool:
        return True

    def is_capturing(self) -> bool:  # an optimizer's step asks (no CUDA graph is captured here)
        return False

    def __enter__(self) -> Any:  # `with stream:` (torch.Stream's own context manager)
        return self

    def __exit__(self, *exc: Any) -> None:
        return None

    def wait_stream(self, stream: Any) -> None:
        return None

    def wait_event(self, event: Any) -> None:
        return None

    def wait(self, stream: Any = None) -> None:
        return None

    def record(self, stream: Any = None) -> None:
        return None

    def record_event(self, event: Any = None) -> Any:
        """torch's `Stream.record_event`: the event given, or a new one, recorded on this stream."""
        event = event if event is not None else Event()
        event.record(self)
        return event


class Event(Stream):
    """`torch.cuda.Event(enable_timing=False, blocking=False, interprocess=False, external=False)`:
    recorded at the script's clock (`time.perf_counter`, the simulated side's clock where it
    skipped time: `rank.simclock`)."""

    def __init__(self, enable_timing: bool = False, blocking: bool = False, interprocess: bool = False,
                 external: bool = False):
        super().__init__()
        self.enable_timing = enable_timing
        self._at: float | None = None

    def record(self, stream: Any = None) -> None:
        self._at = time.perf_counter()

    def elapsed_time(self, end: Event) -> float:
        if not (self.enable_timing and end.enable_timing):
            raise ValueError("Both events must be created with argument 'enable_timing=True'.")
        if self._at is None or end._at is None:
            raise ValueError("Both events must be recorded before calculating elapsed time.")
        return (end._at - self._at) * 1000.0


CURRENT_STREAM = Stream()
