"""Recording what reached each rank's process groups, and turning it into `TraceEntry`s.

Method (details and observations in docs/real-backend.md):

* The c10d **Flight Recorder** (FR) records every collective enqueued on a
  ProcessGroupGloo (or NCCL) backend, including those DDP's C++ reducer issues, with the
  Python frames at the call site. `TORCH_FR_BUFFER_SIZE` must be set before
  `init_process_group`; `dump_fr()` reads it back (pickle form: the only one with frames).
* **Origins** come from the frames: every frame's (file, line) is resolved to the
  qualified name of the enclosing function by parsing that file once (`ast`), so
  `_DDPJoinHook.main_hook` and `_ZeROJoinHook.main_hook`, or `Counter.find_common_rank`
  and `AllReducer.find_common_rank`, are told apart. The innermost recognised frame decides.
* **Phase, iteration and user-step labels** come from the program's own time marks
  (`real_backend.marks`, left by `real_backend.torchrank`): a step window per user
  collective, a phase mark per loop iteration / Join exit / after section.
* **Point-to-point**: Gloo's FR does not record send/recv (they consume an `op_id` but no
  entry appears), so the program's `P2PRecord` marks become the p2p entries.
* **Completion**: FR's per-entry `retired` flag (True once the work finished; Gloo never
  updates `state`). A failed work (peer lost) also counts as retired.
* FR records neither the ReduceOp, the broadcast root nor `async_op`: they are derived
  from the origin and the program (see `_reduce_op`, `_root`, `_ASYNC`).
"""

from __future__ import annotations

import ast
import functools
import math
import os
import pickle
from dataclasses import dataclass
from typing import Any

from real_backend.marks import Marks, P2PRecord, StepWindow
from simdist.report import TraceEntry
from simdist.vocab import REDUCING_OPS as _REDUCING
from simdist.vocab import ROOTED_OPS as _ROOTED

FR_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_SIZE = "20000"

_FR_DTYPES = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}
# Ops without a tensor payload are recorded with numel 0 and this dtype.
NO_DTYPE = "none"

# Origins whose collective is issued with async_op=True (or as a future) by torch.
_ASYNC = {
    "join.notify_join_context.heartbeat",
    "ddp.pre_forward.requires_grad_sync",
    "ddp.join_hook.requires_grad_sync",
    "ddp.backward.bucket_allreduce",
    "ddp.join_hook.bucket_allreduce",
    "zero.step.broadcast_shard",
    "zero.join_hook.broadcast_shard",
}
# Async work torch issues and does not wait on where it is issued (non-joined ranks): the
# heartbeat is waited only by the reducer when divide_by_initial_world_size=False.
FIRE_AND_FORGET = {"join.notify_join_context.heartbeat", "ddp.pre_forward.requires_grad_sync"}


def dump_fr() -> dict[str, Any]:
    """This process's Flight Recorder contents (entries with Python frames)."""
    import torch

    return pickle.loads(torch._C._distributed_c10d._dump_fr_trace())


def fr_progress() -> tuple[int, ...]:
    """A cheap progress fingerprint: per-PG enqueued/completed counters (no entries)."""
    import json

    import torch

    try:
        d = json.loads(torch._C._distributed_c10d._dump_fr_trace_json(includeCollectives=False))
    except Exception:
        return ()
    out: list[int] = []
    for _pg, st in sorted(d.get("pg_status", {}).items()):
        out += [int(st.get("last_enqueued_collective", -1)), int(st.get("last_completed_collective", -1))]
    return tuple(out)


# --------------------------------------------------------------------------- frame -> qualname
_MODULES = {
    "algorithms/join.py": "join",
    "nn/parallel/distributed.py": "ddp",
    "optim/zero_redundancy_optimizer.py": "zero",
    "torch/distributed/utils.py": "dutils",
    "torch/autograd/graph.py": "autograd",
    "torch/autograd/__init__.py": "autograd",
    "real_backend/joinables.py": "joinables",
    "real_backend/torchrank.py": "torchrank",
}


def _module_tag(filename: str) -> str | None:
    f = filename.replace(os.sep, "/")
    for suffix, tag in _MODULES.items():
        if f.endswith(suffix):
            return tag
    return None


@functools.cache
def _function_spans(filename: str) -> list[tuple[int, int, str]]:
    """(first line, last line, qualname) of every function in a source file."""
    try:
        with open(filename, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return []
    spans: list[tuple[int, int, str]] = []

    def visit(node: ast.AST, prefix: str) -> None:
        for child in ast.iter_child_nodes(node):
            if isinstance(child, (ast.FunctionDef, ast.AsyncFunctionDef)):
                q = f"{prefix}{child.name}"
                start = min([d.lineno for d in child.decorator_list] + [child.lineno])
                spans.append((start, child.end_lineno or child.lineno, q))
                visit(child, q + ".")
            elif isinstance(child, ast.ClassDef):
                visit(child, f"{prefix}{child.name}.")
            else:
                visit(child, prefix)

    visit(tree, "")
    return spans


def qualname_at(filename: str, line: int) -> str | None:
    """Qualified name of the innermost function of `filename` containing `line`."""
    best: tuple[int, str] | None = None
    for start, end, q in _function_spans(filename):
        if start <= line <= end and (best is None or end - start < best[0]):
            best = (end - start, q)
    return best[1] if best else None


@functools.cache
def _async_lines_in(filename: str, qualname: str) -> frozenset[int]:
    """Lines inside `qualname` holding a call with `async_op=True` (the heartbeat)."""
    try:
        with open(filename, encoding="utf-8") as fh:
            tree = ast.parse(fh.read())
    except (OSError, SyntaxError, ValueError):
        return frozenset()
    span = next(((s, e) for s, e, q in _function_spans(filename) if q == qualname), None)
    if span is None:
        return frozenset()
    lines = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and span[0] <= node.lineno <= span[1]:
            for kw in node.keywords:
                if kw.arg == "async_op" and isinstance(kw.value, ast.Constant) and kw.value.value is True:
                    lines.update(range(node.lineno, (node.end_lineno or node.lineno) + 1))
    return frozenset(lines)


@dataclass(frozen=True)
class Frame:
    tag: str | None  # module tag (see _MODULES) or None for frames we do not interpret
    qual: str | None
    name: str
    filename: str
    line: int


def resolve_frames(raw: list[dict[str, Any]]) -> list[Frame]:
    out = []
    for f in raw:
        filename, line = f.get("filename", ""), int(f.get("line", 0))
        tag = _module_tag(filename)
        out.append(Frame(tag, qualname_at(filename, line) if tag else None, f.get("name", ""), filename, line))
    return out


def classify(frames: list[Frame], dtype: str) -> str | None:
    """Origin label of a collective from its frames (innermost first).

    Returns "user" for the program's own collective steps (labelled later from the step
    window), None when nothing is recognised.
    """
    quals = {(f.tag, f.qual) for f in frames if f.tag}

    def under(tag: str, qual: str) -> bool:
        return (tag, qual) in quals

    in_ddp_main_hook = under("ddp", "_DDPJoinHook.main_hook")
    for f in frames:
        t, q = f.tag, f.qual
        if t is None or q is None:
            continue
        if t == "join":
            if q == "Join.notify_join_context":
                heartbeat = f.line in _async_lines_in(f.filename, q)
                return "join.notify_join_context.heartbeat" if heartbeat else "join.notify_join_context.throw_check"
            if q == "Join._get_num_nonjoined_procs":
                return "join.exit.count_nonjoined"
            if q == "Join._notify_procs_to_terminate":
                return "join.exit.notify_terminate"
        elif t == "dutils":
            if q == "_verify_param_shape_across_processes":
                return "ddp.init.verify_params"
            if q in ("_sync_module_states", "_sync_params_and_buffers"):
                if under("ddp", "DistributedDataParallel._sync_final_model"):
                    return "ddp.post_hook.broadcast_final_model"
                return "ddp.init.sync_module_states"
        elif t == "ddp":
            m = q.rsplit(".", 1)[-1]
            if m == "_find_common_rank":
                if under("ddp", "DistributedDataParallel._sync_final_model"):
                    return "ddp.post_hook.find_common_rank"
                return "ddp.join_hook.find_common_rank" if in_ddp_main_hook else "ddp.pre_forward.find_common_rank"
            if m in ("_distributed_broadcast_coalesced", "_default_broadcast_coalesced", "_sync_module_buffers"):
                return "ddp.join_hook.sync_buffers" if in_ddp_main_hook else "ddp.pre_forward.sync_buffers"
            if m == "_check_global_requires_backward_grad_sync":
                return "ddp.join_hook.requires_grad_sync" if in_ddp_main_hook else "ddp.pre_forward.requires_grad_sync"
            if m == "_match_all_reduce_for_bwd_pass":
                return "ddp.join_hook.bucket_allreduce"
            if m == "_match_unused_params_allreduce":
                return "ddp.join_hook.unused_map_allreduce"
            if q == "_DDPJoinHook.main_hook":
                return "ddp.join_hook.rebuild_buckets"
            if m == "_pre_forward":
                return "ddp.pre_forward.rebuild_buckets"
        elif t == "zero":
            m = q.rsplit(".", 1)[-1]
            if m in ("_broadcast_params_from_rank", "_sync_params"):
                if under("zero", "_ZeROJoinHook.main_hook"):
                    return "zero.join_hook.broadcast_shard"
                return "zero.step.broadcast_shard"
        elif t == "joinables":
            label = _JOINABLE_LABELS.get(q)
            if label:
                return label
        elif t == "torchrank":
            if q == "TorchRank.user_collective":
                return "user"
        elif t == "autograd":
            # Collectives issued by DDP's C++ reducer from autograd hooks during backward.
            return "ddp.backward.unused_map_allreduce" if dtype == "int32" else "ddp.backward.bucket_allreduce"
    return None


_JOINABLE_LABELS = {
    "Counter.__call__": "counter.call.allreduce",
    "CounterJoinHook.main_hook": "counter.main_hook.allreduce",
    "Counter.find_common_rank": "counter.post_hook.find_common_rank",
    "CounterJoinHook.post_hook": "counter.post_hook.broadcast_max_count",
    "AllReducer.__call__": "allreducer.call.allreduce",
    "AllReducerJoinHook.main_hook": "allreducer.main_hook.allreduce",
    "AllReducer.find_common_rank": "allreducer.post_hook.find_common_rank",
    "AllReducerJoinHook.post_hook": "allreducer.post_hook.broadcast",
}


# --------------------------------------------------------------------------- FR -> TraceEntry
def _numel(sizes: list[list[int]]) -> int:
    return math.prod(sizes[0]) if sizes else 0


def _op_name(profiling_name: str) -> str:
    op = profiling_name.split(":", 1)[-1]
    return {"allreduce": "all_reduce", "allgather": "all_gather", "alltoall": "all_to_all"}.get(op, op)


def _reduce_op(op: str, origin: str, step: StepWindow | None) -> str | None:
    if step is not None:
        return step.reduce_op if op in _REDUCING else None
    if op not in _REDUCING:
        return None
    return "max" if origin.endswith("find_common_rank") else "sum"


def _root(op: str, origin: str, marks: Marks, zero_index: int) -> int | None:
    if op not in _ROOTED:
        return None
    if origin.startswith(("ddp.init.", "ddp.pre_forward.rebuild", "ddp.join_hook.rebuild")):
        return 0
    if origin == "ddp.pre_forward.sync_buffers" and not marks.join_enabled:
        return 0
    if origin in (
        "ddp.post_hook.broadcast_final_model",
        "counter.post_hook.broadcast_max_count",
        "allreducer.post_hook.broadcast",
    ):
        return marks.post_hook_root
    if origin.startswith("zero.") and marks.zero_roots:
        return marks.zero_roots[zero_index % len(marks.zero_roots)]
    return None


def build_trace(
    fr: dict[str, Any] | None, marks: Marks, t_end_ns: int | None = None, deferred: list[bool] | None = None
) -> list[TraceEntry]:
    """Every collective and p2p op of this rank, in issue order, as shared TraceEntries.

    `deferred`, when given, receives one flag per entry: True when the program does not
    wait on that work at the point it is issued (see `waiting_entry`).
    """
    rows = _fr_rows(fr, marks) + [_p2p_row(p, marks) for p in marks.p2p]
    rows.sort(key=lambda r: (r[0], r[1]))
    trace = [r[2] for r in rows]
    if deferred is not None:
        deferred[:] = [r[3] for r in rows]
    # Gloo's FR does not time completions: approximate a completed collective's t_done by
    # the next issue on this rank (or the end of the record), an upper bound for sync ops.
    end = (t_end_ns - marks.t0_ns) / 1e9 if t_end_ns is not None else None
    for k, entry in enumerate(trace):
        if entry.completed and entry.t_done is None:
            nxt = trace[k + 1].t_issue if k + 1 < len(trace) else end
            entry.t_done = max(entry.t_issue, nxt) if nxt is not None else entry.t_issue
    return trace


_Row = tuple[int, int, TraceEntry, bool]  # (time_created_ns, tiebreak, entry, deferred)


def _fr_rows(fr: dict[str, Any] | None, marks: Marks) -> list[_Row]:
    """The collectives FR recorded, labelled from their frames and the program's marks."""
    rows: list[_Row] = []
    zero_index = 0
    for e in (fr or {}).get("entries", []):
        if e.get("is_p2p"):
            continue  # p2p entries come from the program's marks (NCCL's FR has them, Gloo's does not)
        t_ns = int(e["time_created_ns"])
        op = _op_name(e["profiling_name"])
        dtypes = e.get("input_dtypes") or []
        dtype = _FR_DTYPES.get(dtypes[0], dtypes[0].lower()) if dtypes else NO_DTYPE
        numel = _numel(e.get("input_sizes") or [])
        origin = classify(resolve_frames(e.get("frames") or []), dtype) or "unknown"
        step = None
        if origin == "user":
            step = marks.step_at(t_ns)
            origin = step.label if step else "user.unknown"
            if step is not None:  # the call the program made (Gloo may implement it as another op)
                op, numel, dtype = step.op, step.numel, step.dtype
        if op == "barrier":  # no payload; a user barrier keeps its step's dtype (as the simulator)
            numel = 0
        pg_name = str(e["process_group"][0]) if e.get("process_group") else str(e.get("pg_id"))
        group = marks.pg_names.get(pg_name, pg_name)
        phase, it = marks.phase_at(t_ns)
        root = step.root if step is not None and op in _ROOTED else _root(op, origin, marks, zero_index)
        if origin.startswith("zero."):
            zero_index += 1
        entry = TraceEntry(
            seq=int(e["collective_seq_id"]), op=op, numel=numel, dtype=dtype, group=group,
            group_size=marks.group_sizes.get(group, 0), origin=origin, reduce_op=_reduce_op(op, origin, step),
            root=root, async_op=step.async_op if step is not None else origin in _ASYNC, phase=phase,
            iteration=it if phase == "loop" else None, t_issue=(t_ns - marks.t0_ns) / 1e9,
            completed=bool(e.get("retired")),
        )
        if step is not None:
            later = step.async_op and (
                step.wait == "never" or (step.wait == "end_of_iteration" and not marks.waiting_pending)
            )
        else:
            later = origin in FIRE_AND_FORGET
        rows.append((t_ns, int(e.get("record_id", 0)), entry, later))
    return rows


def _p2p_row(p: P2PRecord, marks: Marks) -> _Row:
    phase, it = marks.phase_at(p.t_ns)
    entry = TraceEntry(
        seq=p.seq,
        op=p.op,
        numel=p.numel,
        dtype=p.dtype,
        group="WORLD",
        group_size=marks.group_sizes.get("WORLD", 0),
        origin=p.label,
        peer=p.peer,
        async_op=p.async_op,
        phase=phase,
        iteration=it if phase == "loop" else None,
        t_issue=(p.t_ns - marks.t0_ns) / 1e9,
        t_done=None if p.t_done_ns is None else (p.t_done_ns - marks.t0_ns) / 1e9,
        completed=p.t_done_ns is not None,
    )
    return (p.t_ns, -1, entry, p.async_op and p.wait == "end_of_iteration" and not marks.waiting_pending)


def first_pending(trace: list[TraceEntry]) -> TraceEntry | None:
    """A hung rank's `blocked_in`: its oldest collective that never completed (what the Flight
    Recorder shows as the last completed + 1), the root of the wait. The simulator reports the same."""
    return next((e for e in trace if not e.completed), None)


def waiting_entry(trace: list[TraceEntry], deferred: list[bool]) -> TraceEntry | None:
    """A hung rank's `waiting_in`: the earliest incomplete work that the program waits on where
    it stands. Work nobody waits on yet is skipped, unless nothing else is pending: Join's
    heartbeat and DDP's pre-forward sync flag (issued async, not waited on a non-joined rank),
    user async work that is never waited, or deferred to the end of the iteration."""
    pending = [(e, d) for e, d in zip(trace, deferred, strict=True) if not e.completed]
    return next((e for e, d in pending if not d), pending[0][0] if pending else None)
