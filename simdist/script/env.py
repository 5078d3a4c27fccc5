"""Environment variables through which the launcher reaches every process of a script run.

Children inherit the environment, including those the script starts itself
(`torch.multiprocessing.spawn`, `multiprocessing.Process`), so this is how the rank-side
layer finds the coordinator without the user's code passing anything along.
"""

from __future__ import annotations

import os
from pathlib import Path

SOCKET = "SIMDIST_SCRIPT_SOCKET"  # the coordinator's Unix socket; its presence switches the layer on
RUN_ID = "SIMDIST_SCRIPT_RUN"  # tags every process of one run (cleanup finds them by it)
GPUS = "SIMDIST_SCRIPT_GPUS"  # how many CUDA devices torch.cuda reports
PARENT = "SIMDIST_SCRIPT_PPID"  # the pid a process expects as its parent (orphan check at start)

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "rank" / "bootstrap"


def active() -> bool:
    return bool(os.environ.get(SOCKET))
