"""Process-level set-up of the rank-side layer, run at interpreter start (sitecustomize).

Every process of a script run, whether the launcher started it or the script did:

* dies with its parent (`simdist.procs.die_with_parent`, re-armed in forked children), and
  exits at once if its parent is already gone, so killing `simdist` leaves no process behind;
* reports its printed lines and how it ends (`output`, `exits`);
* lists the files it writes (`writes`: what `compare` sets aside between its sides);
* counts `time.sleep` on the main thread as busy (a sleeping rank is not blocked in a
  collective) and as simulated time passing; on the simulated side every sleep of the script's
  is a timed wait too (`rank.timedwait.sleep`: the coordinator may end it in simulated time
  once every rank is blocked, so a heartbeat thread's loop keeps no timeout from firing);
* installs the simulated backend, the `init_process_group` patch and the CUDA-to-CPU
  remapping right after the script imports torch (an import hook: torch is not imported
  before the script does, so its environment settings still apply). In the "gloo" mode
  the groups are real Gloo ones instead (the same script on real ranks, for comparison);
* keeps this layer out of `torch.compile`'s reach once torch._dynamo is imported
  (`_on_dynamo`).
"""

from __future__ import annotations

import importlib.abc
import importlib.util
import operator
import os
import sys
import threading
import time
from collections.abc import Callable
from typing import Any

from simdist import procs
from simdist.script import env
from simdist.script.rank import alarms, callbacks, childwait, client, exits, output, simclock, stack, timedwait, writes


class _AfterImport(importlib.abc.MetaPathFinder):
    """Runs `callback(module)` once the top-level module `name` has been executed."""

    def __init__(self, name: str, callback: Callable[[Any], None]):  # name: dotted, "torch._dynamo" too
        self.name = name
        self.callback = callback
        self._busy = False

    def find_spec(self, fullname: str, path: Any, target: Any = None) -> Any:
        if fullname != self.name or self._busy:
            return None
        self._busy = True
        try:
            spec = importlib.util.find_spec(fullname)
        finally:
            self._busy = False
        if spec is None or spec.loader is None or not hasattr(spec.loader, "exec_module"):
            return None
        run = spec.loader.exec_module
        finder = self

        def exec_module(module: Any) -> None:
            run(module)
            if finder in sys.meta_path:
                sys.meta_path.remove(finder)
            finder.callback(module)

        spec.loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def _on_torch(_torch: Any) -> None:
    from simdist.script.rank import batches, patches

    patches.install(env.mode())
    gpus = env.gpus()  # 0, a CPU-only node: torch as installed, no GPU shim, no GPU accommodation
    if gpus:
        from simdist.script.rank import compiled_moves, devices, gpu_shims, inductor_outputs, wrapper_devices

        devices.install(gpus)
    batches.install()
    if env.mode() == env.SIM:
        childwait.install_loader(_torch)
    _after_import("torch._dynamo", _on_dynamo)
    _after_import("torch.serialization", writes.install_torch)
    _after_import("torch.jit._script", writes.install_jit)
    if not gpus:
        return
    _after_import("torch.distributed.fsdp._fully_shard._fully_shard", wrapper_devices.place_fsdp2_on_cpu)
    _after_import("torch.distributed.fsdp.fully_sharded_data_parallel", wrapper_devices.place_fsdp_on_cpu)
    _after_import("torch.distributed.tensor._random", gpu_shims.place_dtensor_rng_on_cpu)
    _after_import("torch.distributed.tensor._op_schema", gpu_shims.place_dtensor_meta_on_cpu)
    _after_import("torch._inductor.output_code", inductor_outputs.place_outputs_on_gpu)
    _after_import("torch._dynamo.trace_rules", compiled_moves.know_tensor_methods)
    _after_import("torch._dynamo.output_graph", compiled_moves.plan_outputs)


def _after_import(name: str, callback: Callable[[Any], None]) -> None:
    """`callback(module)` now if `name` is imported (a fork server preloads modules), else
    once it is."""
    if name in sys.modules:
        callback(sys.modules[name])
    else:
        sys.meta_path.insert(0, _AfterImport(name, callback))


# The rank layer's modules that compiled code calls and dynamo must trace like torch's own
# (a skipped function is a graph break): the remapped moves and the shims of torch.cuda.
_TRACED = ("amp.py", "cuda_init.py", "device_args.py", "devices.py", "gpu_memory.py", "gpu_shims.py",
           "wrapper_devices.py")


def _on_dynamo(_dynamo: Any) -> None:
    """Dynamo never starts a frame in this layer, as it never sees a C++ backend's: a compiled
    DDP model's forward runs with dynamo's frame hook set, and the reducer's bucket-rebuild
    broadcast then entered the simulated group's Python `broadcast`, which dynamo tried to
    trace ("Attempted to access unregistered member on an OpaqueObject"). The `_TRACED` files
    are traced when compiled code calls them, as torch's own modules are, but never compiled
    as a frame of their own (dynamo's `BUILTIN_INLINE_WHEN_CALLED`): eager torch code under
    the hook (DDP's `_pre_forward`, on simulated GPUs) calls the `CudaToCpu` mode's
    `__torch_function__` for every op and attribute read, dynamo compiled that frame (a
    dozen recompiles, one per kind of call), and a read through it gave the bucket-rebuild
    broadcast's tensor a `dtype` that was its length (the int 5 for 4 parameters, 7 for 6:
    another call's answer), in the first compiled DDP model of a process. Every other file
    of the package is skipped outright: dynamo names skipped code by file."""
    from torch._dynamo import trace_rules

    root = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))  # simdist/
    here = os.path.dirname(os.path.abspath(__file__))
    inlined = getattr(trace_rules, "BUILTIN_INLINE_WHEN_CALLED", None)  # (an older torch: `_TRACED` not skipped)
    traced = {os.path.join(here, f) for f in _TRACED}
    for folder, _dirs, files in os.walk(root):
        paths = (os.path.join(folder, f) for f in sorted(files) if f.endswith(".py"))
        trace_rules.SKIP_DIRS.extend(p for p in paths if inlined is not None or p not in traced)
    if inlined is not None:
        inlined.update(traced)
    trace_rules._recompile_re()


_LONGEST_S = float(2**62 // 10**9)  # the builtin refuses a longer sleep (OverflowError): left to it


def _patch_sleep() -> None:
    orig = time.sleep
    main = threading.main_thread()

    def sleep(seconds: float) -> None:
        c = client.CLIENT
        # as the builtin reads its length: a float, or an integer by `__index__` (a float32 or a
        # tensor raises TypeError, as there); one it refuses (negative, NaN, too long) raises there
        seconds = seconds if isinstance(seconds, float) else operator.index(seconds)
        if c is None or not 0 <= seconds < _LONGEST_S:
            return orig(seconds)
        if threading.current_thread() is not main:
            # another thread's sleep posts nothing before it ends: on the simulated side a timed wait
            # the coordinator may end in simulated time once every rank is blocked (`rank.timedwait`)
            if not timedwait.sleep(seconds, sys._getframe(1)):
                orig(seconds)
            return None
        if env.mode() == env.SIM and (due := alarms.due_within(seconds)) is not None:  # a signal may cut it
            start = simclock.now()
            main_sleep(c, due)
            alarms.land(orig)  # (its handler runs here: one that raises ends the sleep at the signal)
            return main_sleep(c, max(seconds - (simclock.now() - start), 0.0))
        return main_sleep(c, seconds)

    def main_sleep(c: client.Client, seconds: float) -> None:
        c.sleeping += 1
        # simulated time passes as the sleep says (`RankConn.sleep`): said first, so that the
        # waits of peers that time out meanwhile end before this rank posts again
        said = {"t": "sleep", "s": max(float(seconds), 0.0), "cpu": time.thread_time(),
                "frames": stack.caller_stack(2)}  # (where it stood while asleep: `script.agent`)
        try:
            if not timedwait.sleep(seconds, sys._getframe(2), said):  # (told, it is a timed wait too)
                c.send(said)
                orig(seconds)
        finally:
            c.sleeping -= 1

    time.sleep = simclock.unbound("sleep", sleep)  # (binds no instance, as the builtin: `wait = time.sleep` in a class body; pickles as it)


def _after_fork_child() -> None:
    client.forget_after_fork()
    callbacks.forget_after_fork()
    output.forget_after_fork()
    procs.die_with_parent()  # the environment still names the parent (set in `install`)
    os.environ[procs.LAUNCHER_PID_ENV] = str(os.getpid())


def install() -> None:
    procs.die_with_parent()  # checks that the parent named in the environment is still ours
    os.environ[procs.LAUNCHER_PID_ENV] = str(os.getpid())  # what this process's children check
    os.register_at_fork(after_in_child=_after_fork_child)
    output.install()
    exits.install()
    writes.install()
    _patch_sleep()
    if env.mode() == env.SIM:  # before torch, which imports tqdm (`torch.hub`): its `from time import time`
        simclock.install()     # must get the clock that reads simulated time (`rank.simclock`)
        childwait.install()
    _after_import("torch", _on_torch)
