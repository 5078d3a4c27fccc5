"""Run a user's own, unmodified torch.distributed script on simulated ranks.

Each rank is a real process running the user's script; its process groups hand every
operation to the simulator's engine, which runs in the `simdist` process (the
*coordinator*) and pairs, checks and computes them as in scenario mode.

* `rank/`: what runs inside the user's processes (bootstrap, process group, device remap).
* `coordinator`, `launch`, `api`: the simdist side (socket server, processes, the report).
* `wire`, `env`: what both sides share.

`run_script` is resolved lazily: rank processes import `simdist.script.rank` and must not
pay for the engine (simpy, numpy, the checker) they never use.
"""

from __future__ import annotations

from typing import Any

__all__ = ["run_script"]


def __getattr__(name: str) -> Any:
    if name == "run_script":
        from simdist.script.api import run_script

        return run_script
    raise AttributeError(name)
