"""The Flight Recorder of a rank on real Gloo (the script backend's "gloo" mode), read at exit.

Sent to the coordinator with the rank's exit, so the same script's collective sequence on
real Gloo can be set beside the simulated one (origins from the same frames classifier).
"""

from __future__ import annotations

import _imp
import contextlib
import pickle
import sys
import types
from collections.abc import Iterator
from typing import Any

import torch
import torch.distributed as dist

from simdist.script import env
from simdist.script.rank import client, stack


def _groups() -> dict[str, list[int]]:
    """Each group's members in group-rank order (member i is group rank i: not sorted where
    new_group had sort_ranks=False), as the rebuild maps a group rank to a global one."""
    world = dist.distributed_c10d._world
    out = {}
    for group, ranks in world.pg_group_ranks.items():
        name = world.pg_names.get(group)
        if name is not None:
            out[env.group_name(str(name), group is world.default_pg, _generation())] = sorted(ranks, key=ranks.__getitem__)
    return out


def _generation(t_ns: int | None = None) -> int:
    """The generation of ranks current now, or when FR recorded an entry at `t_ns` (a process
    that initialised again holds both generations' entries in one recorder)."""
    c = client.CLIENT
    if c is None:
        return 1
    return c.generation if t_ns is None else c.generation_at(t_ns)


_before_destroy: dict[str, Any] = {}  # the last dump taken before a group was destroyed


def install() -> None:
    """Scripts often end with `destroy_process_group()`, after which torch no longer knows
    the groups' names and members: dump FR just before any group is destroyed, and merge."""
    import functools

    import torch.distributed.distributed_c10d as c10d

    orig = c10d.destroy_process_group

    @functools.wraps(orig)
    def destroy_process_group(*args: Any, **kwargs: Any) -> Any:
        if dist.is_initialized():
            _before_destroy.update(dump())
        return orig(*args, **kwargs)

    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def dump() -> dict[str, Any]:
    """This rank's collectives as FR recorded them (p2p excluded: Gloo's FR has none)."""
    if not dist.is_initialized():
        return dict(_before_destroy)
    with _no_inductor_lookup():
        d = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    entries = []
    for e in d.get("entries", []):
        if e.get("is_p2p"):
            continue
        pg = e.get("process_group") or (str(e.get("pg_id")), "")
        frames = [[f.get("filename", ""), int(f.get("line", 0)), f.get("name", ""),
                   stack.is_user_file(f.get("filename", ""))] for f in e.get("frames") or []]
        t = int(e.get("time_created_ns") or 0)
        entries.append({"seq": int(e["collective_seq_id"]),
                        "pg": env.group_name(str(pg[0]), pg[1] == "default_pg", _generation(t)),
                        "op": e["profiling_name"], "sizes": e.get("input_sizes") or [],
                        "out_sizes": e.get("output_sizes") or [], "out_dtypes": e.get("output_dtypes") or [],
                        "dtypes": e.get("input_dtypes") or [], "frames": frames, "retired": bool(e.get("retired")),
                        "t": t})
    return {"entries": entries, "groups": {**_before_destroy.get("groups", {}), **_groups()}}


class _NoGeneratedCode:
    """`torch._inductor.codecache.PyCodeCache`'s one answer the dump asks for, in a process
    that never imported torch._inductor: no line is inductor-generated code."""

    @staticmethod
    def stack_frames_for_code(path: str, lineno: int) -> None:
        return None


@contextlib.contextmanager
def _no_inductor_lookup() -> Iterator[None]:
    """FR's dump symbolizes its frames and asks `torch._inductor.codecache.PyCodeCache` which
    lines are inductor-generated code; in a process that never imported torch._inductor there
    is none, but the lookup imports it, and torch._dynamo with it: 2.4 s measured. At a rank's
    exit that held its process, and so its Gloo pairs, open: without the fork server (which
    preloads it) peers lost a rank 0.8-1.7 s after its last line instead of 0.03-0.08 s, and an
    `os._exit` failure reached torchrun's agent that late (docs/script-backend.md, "torchrun's
    agent"). So for the dump's duration, under the import lock (no other thread imports
    meanwhile), a stand-in answers; it is taken away after."""
    if "torch._inductor" in sys.modules:
        yield
        return
    inductor, codecache = types.ModuleType("torch._inductor"), types.ModuleType("torch._inductor.codecache")
    codecache.PyCodeCache = _NoGeneratedCode  # type: ignore[attr-defined]
    inductor.codecache = codecache  # type: ignore[attr-defined]
    stand_ins = {"torch._inductor": inductor, "torch._inductor.codecache": codecache}
    _imp.acquire_lock()
    try:
        sys.modules.update(stand_ins)
        yield
    finally:
        for name, mod in stand_ins.items():
            if sys.modules.get(name) is mod:
                del sys.modules[name]
        _imp.release_lock()
