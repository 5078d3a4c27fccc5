"""From a job's dumps to a scenario that does it again: each rank's operations, in its order.

The scenario has the job's groups and, in `[[after]]` (no inputs, no loop), one raw
collective step per operation a rank issued -- restricted by `ranks` to the ranks that
issued it there -- up to where the rank stopped. Steps that several ranks issued alike,
next in their order, are written once. A rank's own order is all that matters: collectives
pair by their per-group sequence number, as on the backend, whatever the file order
between ranks. What the dumps do not record is chosen so as not to change the pairing:

* reduce op: the one recorded (none is: sum); root: the group's first rank (every rank
  agrees on it, as in the job, where a root mismatch would be a different failure);
* values: ones (the verdict does not depend on them);
* ``async``: an operation that never completed although the rank issued more after it was
  issued with ``async_op=True`` and not waited (``wait = "never"``); the rank's last one is
  waited, so the rank blocks where it did;
* a rank whose error file says it raised (other than losing a peer or timing out, which
  the backend does by itself) raises the same message after its last operation (`raise`);
* ``on_finish = "exit"`` when a rank lost a peer (the peer's process ended), else ``stay``
  (a finished rank stays alive, so its peers block rather than fail).
"""

from __future__ import annotations

from typing import Any

from simdist.flightrec.rebuild import Rebuilt
from simdist.report import RankResult, TraceEntry
from simdist.vocab import DTYPE_BYTES, P2P_OPS, ROOTED_OPS, USER_ORIGIN_PREFIX, WORLD, reduce_op_of

REPLAY_TIMEOUT_S = 10.0  # the real backend's watchdog for the replay (a replay has no compute)
_RAISED = ("peer_lost", "timeout", "killed", "gloo_abort")  # failures the backend makes by itself


def replay_scenario(job: Rebuilt, name: str = "replay", description: str = "",
                    timeout_s: float = REPLAY_TIMEOUT_S) -> dict[str, Any]:
    """The scenario (a dict for `parse_scenario`, TOML-ready) that replays the job's operations."""
    report = job.report
    w = report.world_size
    per_rank = [_rank_steps(job, r) for r in report.ranks]
    lost_peer = any(r.error is not None and r.error.category == "peer_lost" for r in report.ranks)
    doc: dict[str, Any] = {
        "name": name,
        "description": description or "Each rank's operations as its Flight Recorder dump records them.",
        "world_size": w,
        "backend": report.backend if report.backend in ("gloo", "nccl") else "gloo",
        "timeout_s": timeout_s,
        "on_finish": "exit" if lost_peer else "stay",
        "inputs": {"counts": [0] * w},
    }
    groups = [{"name": g.name, "ranks": g.ranks} for g in job.groups if g.name != WORLD]
    if groups:
        doc["groups"] = groups
    doc["after"] = _merge(per_rank, w)
    doc["expect"] = {"outcome": report.outcome}
    return doc


def _rank_steps(job: Rebuilt, r: RankResult) -> list[dict[str, Any]]:
    """Rank r's steps, in its order (without `ranks`, which the merge adds)."""
    steps = []
    for k, e in enumerate(r.trace):
        later = k + 1 < len(r.trace)
        if e.op not in P2P_OPS:
            steps.append(_collective_step(job, e, async_=later and not e.completed))
        elif e.peer is not None:  # a send/recv whose peer the name did not give cannot be replayed
            steps.append(_p2p_step(r.rank, e))
    if r.error is not None and r.status == "error" and r.error.category not in _RAISED:
        steps.append({"kind": "raise", "message": r.error.message or r.error.type})
    return steps


def _collective_step(job: Rebuilt, e: TraceEntry, async_: bool) -> dict[str, Any]:
    step: dict[str, Any] = {"kind": "collective", "op": e.op}
    if e.op != "barrier":
        step["numel"] = e.numel
        if e.dtype != "float32":
            step["dtype"] = e.dtype if e.dtype in DTYPE_BYTES else "float32"
    red = reduce_op_of(e.op, e.reduce_op)
    if red is not None and red != "sum":
        step["reduce_op"] = red
    if e.op in ROOTED_OPS:
        step["root"] = e.root if e.root is not None else min(job.group_ranks(e.group))
    if e.group != WORLD:
        step["group"] = e.group
    if async_:
        step.update({"async": True, "wait": "never"})
    step["name"] = e.origin.removeprefix(USER_ORIGIN_PREFIX)
    return step


def _p2p_step(rank: int, e: TraceEntry) -> dict[str, Any]:
    """One side of a send/recv (the partner writes its own side, in its own order)."""
    src, dst = (rank, e.peer) if e.op == "send" else (e.peer, rank)
    step: dict[str, Any] = {"kind": "p2p", "src": src, "dst": dst, "numel": max(1, e.numel)}
    if e.dtype != "float32" and e.dtype in DTYPE_BYTES:
        step["dtype"] = e.dtype
    return step


def _merge(per_rank: list[list[dict[str, Any]]], w: int) -> list[dict[str, Any]]:
    """One list of steps in which every rank finds exactly its own, in its order: the lowest
    rank with steps left writes its next one, for every rank whose next step is the same."""
    at = [0] * w
    out: list[dict[str, Any]] = []
    while True:
        left = [r for r in range(w) if at[r] < len(per_rank[r])]
        if not left:
            return out
        step = per_rank[left[0]][at[left[0]]]
        same = [r for r in left if per_rank[r][at[r]] == step] if step["kind"] != "p2p" else [left[0]]
        for r in same:
            at[r] += 1
        out.append(step if step["kind"] != "p2p" and len(same) == w else {**step, "ranks": same})
