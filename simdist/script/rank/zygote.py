"""The fork server (zygote): one process with torch and simdist's rank layer already imported
that forks a rank process per request, so a run does not pay an interpreter start and
`import torch` (1-2 s) per rank. The fuzzer runs hundreds of short schedules this way.

Started by `simdist.script.zygote.Zygote` as `python -m simdist.script.rank.zygote [SCRIPT] FD`
(SCRIPT: whose torch/NumPy imports to preload besides the common ones; the script each
child runs is its request's) with the run's bootstrap environment, so the rank layer (sitecustomize) is installed here
exactly as in a freshly launched rank; FD is its control socket. Per request
(`{"env": {...}, "argv": [...]}`) it forks a child that becomes what `python SCRIPT ARGS`
with that environment would be. `simdist.forkserver` does what every forked child needs (new
session, dying with the zygote, the request's environment: RANK, WORLD_SIZE, the
coordinator's socket, the run id, `--batches` caps, which children the script execs inherit;
`sys.argv`, fresh seeds, the exit); here the script's own part:

* `sys.path[0]` as the interpreter sets it for a script, the `--batches` caps re-read, and
  CUDA not initialised (`cuda_init.fresh_process`: a preloaded module that asked
  `torch.cuda.is_available()` made the server's children bad forks);
* the script runs as the `__main__` module, compiled and executed as the interpreter runs
  a script file (not imported: it is the user's program, not a module); an uncaught
  exception goes through `sys.excepthook` and exit status 1, `SystemExit` gives its code.

The rank layer's fork hook also re-arms PR_SET_PDEATHSIG in processes the script forks.
"""

from __future__ import annotations

import ast
import builtins
import contextlib
import gc
import importlib
import os
import sys
import types
import weakref
from typing import Any

from simdist import forkserver

# Imported once here rather than in every rank; what a DDP/ZeRO/Join script typically uses.
PRELOAD = ("torch", "torch._dynamo", "torch.distributed", "torch.nn", "torch.nn.functional", "torch.nn.parallel", "torch.optim",
           "torch.utils.data", "torch.utils.data.distributed", "torch.multiprocessing",
           "torch.distributed.algorithms.join", "torch.distributed.optim", "argparse", "numpy",
           "torch.profiler._cupti_monitor")  # (imported at a rank's first record_function, e.g. DDP's forward: 2 ms)
_SAFE_TOP = {"torch", "numpy"}  # the script's own imports preloaded only from these packages


def _script_imports(path: str) -> list[str]:
    """Modules the script imports at top level from torch or numpy (importing them has no
    effect a rank would see; the user's own modules are left to each rank)."""
    try:
        tree = ast.parse(open(path, encoding="utf-8").read())
    except (OSError, SyntaxError, ValueError):
        return []
    names = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            names += [a.name for a in node.names]
        elif isinstance(node, ast.ImportFrom) and node.module and not node.level:
            names.append(node.module)
    return [n for n in names if n.split(".")[0] in _SAFE_TOP]


def preload(script: str | None) -> None:
    for name in (*PRELOAD, *(_script_imports(script) if script else ())):
        with contextlib.suppress(Exception):
            importlib.import_module(name)


def _run_as_main(path: str) -> None:
    """What `python PATH` does with the file: compile it, run it as a fresh `__main__`."""
    with open(path, "rb") as fh:
        code = compile(fh.read(), path, "exec")
    main = types.ModuleType("__main__")
    main.__dict__.update(__file__=path, __builtins__=builtins, __spec__=None, __loader__=None, __cached__=None)
    sys.modules["__main__"] = main
    exec(code, main.__dict__)


def _child(request: dict[str, Any]) -> int:
    """In the forked child (already in the request's environment, `simdist.forkserver`):
    become `python SCRIPT ARGS`; the exit status."""
    sys.path[0] = os.path.dirname(os.path.abspath(sys.argv[0]))
    from simdist.script.rank import batches, exits

    batches.configure()
    exits.claim()  # the rank's own process (the server's claim went with its environment)
    init = sys.modules.get("simdist.script.rank.cuda_init")
    if init is not None:  # a new interpreter's CUDA state: the preloads' calls were not the script's
        init.fresh_process()
    code = forkserver.run_program(lambda: _run_as_main(sys.argv[0]))
    exits.program_exit(code)  # a `raise SystemExit(n)`: its status, before the exit handlers report the rank
    return code


def quiet_preloaded_finalizers() -> int:
    """Keep the finalizers that the preloaded imports registered from running at a rank's
    exit; how many there were. Why: torch registers one `weakref.finalize(_del_library)` per
    `torch.library.Library` it makes at import (~170); at exit each deregisters its kernels
    from the dispatcher, which in a forked rank copies the pages it touches: ~30 ms of CPU
    per rank (measured, torch 2.13: 40% of a small DDP rank's CPU) and ~100 ms under load
    before the rank tells the coordinator that it leaves, all to tidy up a process that is
    ending. Nothing outside the process can see it, and a fresh `python SCRIPT` runs them
    after every exit handler of the script's anyway (they were registered first), so the
    script sees no difference either. Finalizers the script itself registers still run.
    (`finalize._registry` is CPython's table of live finalizers, the only way to reach them.)"""
    live = list(weakref.finalize._registry)  # type: ignore[attr-defined]
    for fin in live:
        fin.atexit = False
    return len(live)


def main() -> int:
    preload(sys.argv[1] if len(sys.argv) > 2 else None)  # [SCRIPT] FD
    quiet_preloaded_finalizers()
    # What torch and simdist made here (~285,000 objects) is permanent: a rank's garbage
    # collections, and its exit's scan for files its script left open
    # (`exits._flush_open_files`: 0.1 s of CPU over them, with its sockets open meanwhile),
    # see only what the script itself made. (CPython's advice for fork servers.)
    gc.freeze()
    return forkserver.main(_child)


if __name__ == "__main__":
    sys.exit(main())
