"""Real backend: replay a scenario on torch.distributed processes and record what happened.

`run_real(scenario)` (in `real_backend.launch`) runs it on this host and returns a
`simdist.report.Report` with source "real"; `simdist.compare.compare_reports` diffs it
against the simulator's. See docs/real-backend.md.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from real_backend.launch import run_real as run_real


def __getattr__(name: str) -> Any:
    if name == "run_real":  # lazy: importing the package must not start torch
        from real_backend.launch import run_real

        return run_real
    raise AttributeError(name)


__all__ = ["run_real"]
