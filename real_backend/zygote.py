"""The real-backend workers' fork server (process side): torch and the worker imported once.

Started by `real_backend.workers.WorkerZygote` as ``python -m real_backend.zygote FD`` with
the environment every worker shares (`workers.worker_base_env`); FD is its control socket.
It imports what a worker imports (torch, torch.distributed, the worker, the program's
driver, the recording) and warms the traceback symbolizer a worker warms first thing (its
caches are memory only), without starting a thread or touching torch's thread pools (which
is what makes forking it safe; importing torch leaves one idle native thread parked on a
futex, as in every torch process a DataLoader forks from), then serves
`simdist.forkserver`'s loop. Each child, once `simdist.forkserver` gave it the request's
stdin (the launcher's control pipe), stdout/stderr (the rank's log), environment, working
directory and session, runs ``real_backend.worker.main(ARGS)`` as ``python -m
real_backend.worker ARGS`` would, and leaves with `os._exit` (the worker itself always ends
that way).
"""

from __future__ import annotations

import importlib
import sys
from typing import Any

from real_backend import worker
from simdist import forkserver, procs

# What a worker imports before its process group exists: torch, the worker's own modules (the
# program's driver imports the DDP/Join/optimizer parts of torch), and what the worker imports
# lazily on its way (torchelastic's error file and control plane).
PRELOAD = ("torch", "torch.distributed", "real_backend.worker", "real_backend.torchrank", "real_backend.record",
           "real_backend.failure", "torch.distributed.elastic.multiprocessing.errors",
           "torch.distributed.elastic.control_plane", "simdist.report", "simdist.scenario")


def _child(request: dict[str, Any]) -> int:
    """In the forked child (already in the request's environment, with what torch reads of
    it at import redone: `forkserver.apply_torch_env`): ``python -m real_backend.worker
    ARGS``; the exit status."""
    sys.argv[0] = worker.__file__
    return forkserver.run_program(lambda: worker.main(sys.argv[1:]))


def main() -> int:
    procs.die_with_parent()  # the zygote ends with its launcher; its children end with it
    for name in PRELOAD:
        importlib.import_module(name)
    worker.warm_symbolizer()  # in-memory state only (no thread, file or process): ~1 CPU s saved per rank
    return forkserver.main(_child)


if __name__ == "__main__":
    sys.exit(main())
