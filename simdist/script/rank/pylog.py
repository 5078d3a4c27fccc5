"""What a rank's Flight Recorder leaves out on real Gloo: p2p operations, and the reduce op
and root of the collectives that Python code calls.

In the "gloo" mode every `send`/`recv` (and a recv from any source) that Python code asks
of a process group -- `dist.send`, `isend`, `batch_isend_irecv`, ... all end in the
group's methods -- is noted with its peer, size, group and call site, numbered per group
as the simulator numbers p2p operations; and each all_reduce, reduce, broadcast, gather
and scatter called from Python notes its reduce op and root under the group's sequence
number, which is the Flight Recorder's. Collectives that C++ issues (DDP's buckets) pass
no Python code and keep neither. Sent with the rank's exit beside the Flight Recorder
(`rank.flight`), so both sides of a comparison show the same operations.
"""

from __future__ import annotations

import time
from typing import Any

import torch.distributed as dist

from simdist.script import env
from simdist.script.rank import client, gloo_args, stack
from simdist.script.rank.pg import reduce_label

_ops: list[dict[str, Any]] = []
_seq: dict[str, int] = {}
_args: list[list[Any]] = []  # [group, seq, reduce op, root] of collectives called from Python
_done_before = [0]  # every p2p operation before this index has completed (`progress`)


def _raw_name(pg: Any) -> str:
    """torch's name of the group (the Flight Recorder's `pg_status` key)."""
    return str(dist.distributed_c10d._world.pg_names.get(pg, ""))


def _group_name(pg: Any) -> str:
    world = dist.distributed_c10d._world
    return env.group_name(_raw_name(pg), pg is world.default_pg, client.CLIENT.generation if client.CLIENT else 1)


class _FailedAtCall:
    """A p2p call Gloo failed as it was posted (its peer's pair already closed): it was
    issued, and has ended, as the simulator records one that fails as it posts."""

    @staticmethod
    def is_completed() -> bool:
        return True

    @staticmethod
    def _source_rank() -> int:
        return -1


def _wrap(method: str, op: str) -> None:
    orig = getattr(dist.ProcessGroup, method)

    def call(self: Any, tensors: list, *args: Any) -> Any:
        frames = stack.caller_stack(1)
        ranks = dist.get_process_group_ranks(self)  # kept: the group may be destroyed before the dump
        peer = ranks[args[0]] if method != "recv_anysource" else None
        try:
            work = orig(self, tensors, *args)
        except RuntimeError:
            # whether a peer's exit had closed the pair before this call or only before its
            # wait is a race of the processes: either way the operation was issued. One that
            # Gloo's argument checks refused never was (nor is it in the simulator)
            if gloo_args.p2p_issued(tensors, self.rank(), args[0] if peer is not None else None):
                _note(self, op, peer, ranks, tensors, frames, _FailedAtCall())
            raise
        _note(self, op, peer, ranks, tensors, frames, work)
        return work

    setattr(dist.ProcessGroup, method, call)


def _note(pg: Any, op: str, peer: int | None, ranks: list[int], tensors: list, frames: list, work: Any) -> None:
    name = _group_name(pg)
    _seq[name] = _seq.get(name, 0) + 1
    _ops.append({"seq": _seq[name], "op": op, "pg": name, "raw_pg": _raw_name(pg), "peer": peer, "ranks": ranks,
                 "n": sum(t.numel() for t in tensors), "dt": str(tensors[0].dtype).removeprefix("torch."),
                 "frames": frames, "t": time.time_ns(), "work": work})


def _wrap_collective(method: str) -> None:
    orig = getattr(dist.ProcessGroup, method)

    def call(self: Any, *args: Any, **kwargs: Any) -> Any:
        work = orig(self, *args, **kwargs)
        opts = next((a for a in args if hasattr(a, "rootRank") or hasattr(a, "reduceOp")), None)
        if opts is not None:
            root = getattr(opts, "rootRank", None)
            red = getattr(opts, "reduceOp", None)
            # the group's sequence number counts its p2p operations too, the Flight Recorder's
            # collective numbering does not: take away the group's p2p operations so far
            name = _group_name(self)
            _args.append([name, int(self._get_sequence_number_for_group()) - _seq.get(name, 0),
                          reduce_label(red) if red is not None else None,
                          dist.get_process_group_ranks(self)[root] if root is not None else None])
        return work

    setattr(dist.ProcessGroup, method, call)


def install() -> None:
    _wrap("send", "send")
    _wrap("recv", "recv")
    _wrap("recv_anysource", "recv")
    for method in ("allreduce", "reduce", "broadcast", "gather", "scatter"):
        _wrap_collective(method)


def collective_args() -> list[list[Any]]:
    """[group, seq, reduce op, root] of each collective called from Python."""
    return list(_args)


def dump() -> list[dict[str, Any]]:
    """The rank's p2p operations so far, JSON-ready (a recv from any source names its
    sender once it completed with a message; a failed one names none, as the simulator's)."""
    out = []
    for o in _ops:
        work, peer = o["work"], o["peer"]
        done = bool(work.is_completed())
        # a failed one (its peer gone, timed out) is completed too, with no source: -1
        if peer is None and done and (src := work._source_rank()) >= 0:
            peer = o["ranks"][src]
        out.append({k: v for k, v in o.items() if k not in ("work", "ranks", "raw_pg")} | {"peer": peer, "done": done})
    return out


def progress(generation: int = 1) -> tuple[int, int, set[str]]:
    """How many p2p operations were issued and how many completed, and torch's names of the
    groups of those of `generation` that have not (`rank.stall`, ten times a second: Gloo's
    Flight Recorder counts no p2p; one of an earlier generation's groups, destroyed, is no
    wait: it never finishes, and its group's name is a current group's again). Operations
    before the first unfinished one are not looked at again."""
    ops = _ops[:]
    while _done_before[0] < len(ops) and ops[_done_before[0]]["work"].is_completed():
        _done_before[0] += 1
    open_ops = [o for o in ops[_done_before[0]:] if not o["work"].is_completed()]
    return len(ops), len(ops) - len(open_ops), {o["raw_pg"] for o in open_ops
                                                if env.generation_of(o["pg"]) == generation}
