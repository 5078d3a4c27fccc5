"""Point-to-point operations of a rank on real Gloo, which its Flight Recorder leaves out.

In the "gloo" mode every `send`/`recv` (and a recv from any source) that Python code asks
of a process group -- `dist.send`, `isend`, `batch_isend_irecv`, ... all end in the
group's methods -- is noted with its peer, size, group and call site, numbered per group
as the simulator numbers p2p operations, and sent with the rank's exit beside the Flight
Recorder (`rank.flight`), so both sides of a comparison show the same p2p sequence.
"""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist

from simdist.script import env
from simdist.script.rank import stack

_ops: list[dict[str, Any]] = []
_seq: dict[str, int] = {}


def _group_name(pg: Any) -> str:
    world = dist.distributed_c10d._world
    return env.group_name(str(world.pg_names.get(pg, "")), pg is world.default_pg)


def _wrap(method: str, op: str) -> None:
    orig = getattr(dist.ProcessGroup, method)

    def call(self: Any, tensors: list, *args: Any) -> Any:
        frames = stack.caller_stack(1)
        work = orig(self, tensors, *args)
        name = _group_name(self)
        _seq[name] = _seq.get(name, 0) + 1
        ranks = dist.get_process_group_ranks(self)  # kept: the group may be destroyed before the dump
        peer = ranks[args[0]] if method != "recv_anysource" else None
        _ops.append({"seq": _seq[name], "op": op, "pg": name, "peer": peer, "ranks": ranks,
                     "n": sum(t.numel() for t in tensors), "dt": str(tensors[0].dtype).removeprefix("torch."),
                     "frames": frames, "t": time.time_ns(), "work": work})
        return work

    setattr(dist.ProcessGroup, method, call)


def install() -> None:
    _wrap("send", "send")
    _wrap("recv", "recv")
    _wrap("recv_anysource", "recv")


def dump() -> list[dict[str, Any]]:
    """The rank's p2p operations so far, JSON-ready (a recv from any source names its
    sender once it completed)."""
    out = []
    for o in _ops:
        work, peer = o["work"], o["peer"]
        done = bool(work.is_completed())
        if peer is None and done:
            peer = o["ranks"][work._source_rank()]
        out.append({k: v for k, v in o.items() if k not in ("work", "ranks")} | {"peer": peer, "done": done})
    return out
