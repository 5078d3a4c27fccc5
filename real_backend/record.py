"""Recording what reached each rank's process groups, and turning it into `TraceEntry`s.

Method (details and observations in docs/real-backend.md):

* The c10d **Flight Recorder** (FR) records every collective enqueued on a
  ProcessGroupGloo (or NCCL) backend, including those DDP's C++ reducer issues, with the
  Python frames at the call site. `TORCH_FR_BUFFER_SIZE` must be set before
  `init_process_group`; `dump_fr()` reads it back (pickle form: the only one with frames).
  With `TORCH_FR_DUMP_TEMP_FILE` set, `write_dump_file` also writes torch's own bytes where
  torch's DebugInfoWriter would (``<prefix><rank>``), for `simdist diagnose`.
* **Origins** come from the frames, classified by `simdist.frames` (shared with the
  script backend, which sends the same Python frames from its process group).
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

import os
import pickle
from typing import Any

from real_backend.marks import Marks, P2PRecord, StepWindow
from simdist.flightrec.format import FR_BUFFER_SIZE as FR_BUFFER_SIZE
from simdist.flightrec.format import FR_DUMP_ENV, LEGACY_DUMP_ENV, dump_path, fr_dtype, fr_numel, fr_op_name
from simdist.flightrec.format import FR_ENV as FR_ENV
from simdist.frames import classify, resolve_frames
from simdist.report import TraceEntry
from simdist.vocab import REDUCING_OPS as _REDUCING
from simdist.vocab import ROOTED_OPS as _ROOTED

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


def dump_fr_bytes() -> bytes:
    """This process's Flight Recorder contents as torch pickles them (entries with Python frames)."""
    import torch

    return torch._C._distributed_c10d._dump_fr_trace()


def dump_fr() -> dict[str, Any]:
    """This process's Flight Recorder contents (entries with Python frames)."""
    return pickle.loads(dump_fr_bytes())


def write_dump_file(rank: int, data: bytes) -> str | None:
    """Write a dump as torch's DebugInfoWriter does: to ``${TORCH_FR_DUMP_TEMP_FILE}<rank>`` (or the
    older TORCH_NCCL_DEBUG_INFO_TEMP_FILE), when set. ProcessGroupNCCL's watchdog does this on a
    timeout; Gloo's has no watchdog, so the rank does it when it ends (done, raised, told it hangs)."""
    prefix = os.environ.get(FR_DUMP_ENV) or os.environ.get(LEGACY_DUMP_ENV)
    if not prefix:
        return None
    path = dump_path(prefix, rank)
    tmp = f"{path}.writing"
    with open(tmp, "wb") as fh:
        fh.write(data)
    os.replace(tmp, path)
    return path


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


# --------------------------------------------------------------------------- FR -> TraceEntry
def _reduce_op(op: str, origin: str, step: StepWindow | None) -> str | None:
    if step is not None:
        return step.reduce_op if op in _REDUCING else None
    if op not in _REDUCING:
        return None
    return "max" if origin.endswith("find_common_rank") else "sum"


def _root(op: str, origin: str, group: str, marks: Marks, zero_index: int) -> int | None:
    if op not in _ROOTED:
        return None
    first = marks.group_ranks.get(group, [0])[0]  # DDP's group rank 0, as a global rank
    if origin.startswith(("ddp.init.", "ddp.pre_forward.rebuild", "ddp.join_hook.rebuild")):
        return first
    if origin == "ddp.pre_forward.sync_buffers" and not marks.join_enabled:
        return first
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
        op = fr_op_name(e["profiling_name"])
        dtypes = e.get("input_dtypes") or []
        dtype = fr_dtype(dtypes)
        numel = fr_numel(e.get("input_sizes") or [])
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
        root = step.root if step is not None and op in _ROOTED else _root(op, origin, group, marks, zero_index)
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
