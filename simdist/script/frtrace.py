"""A rank's operations on real Gloo as the report's trace: its Flight Recorder entries (`rank.flight`)
and its p2p operations (`rank.pylog`), in the simulator's terms.

Kept apart from `build` (which reports both sides) because it reads the real side's records only.
"""

from __future__ import annotations

from typing import Any

from simdist.flightrec.format import fr_dtype, fr_numel, fr_op_name
from simdist.frames import phase_of, script_origin
from simdist.report import TraceEntry
from simdist.script import env
from simdist.script.ranks import raw_frames


def fr_trace(fr: dict[str, Any], p2p: list[dict[str, Any]] | None = None,
             args: list[list[Any]] | None = None) -> list[TraceEntry]:
    """A rank's operations on real Gloo in the simulator's terms, in the order it issued them:
    its collectives from its Flight Recorder (see `rank.flight`), with the reduce op and root
    of those called from Python, and its p2p operations (`rank.pylog`). Times are relative."""
    entries = fr.get("entries") or []
    groups = fr.get("groups") or {}
    p2p = p2p or []
    known = {(g, seq): (red, root) for g, seq, red, root in args or []}
    t0 = min([e["t"] for e in entries] + [o["t"] for o in p2p], default=0)
    out = []
    for e in entries:
        frames, user = raw_frames(e["frames"])
        op, dtype, size = fr_op_name(e["op"]), fr_dtype(e["dtypes"]), len(groups.get(e["pg"], []))
        if op == "barrier":  # no tensor: FR records none, both sides' traces give it the same dtype
            numel, dtype = 0, env.BARRIER_DTYPE
        else:
            numel = fr_numel(e["sizes"])
        if op == "scatter":  # a non-root has no input: the size is its output's, times the group's (as simulated)
            numel, dtype = fr_numel(e.get("out_sizes") or []) * size, fr_dtype(e.get("out_dtypes") or [])
        red, root = known.get((e["pg"], e["seq"]), (None, None))
        out.append(TraceEntry(seq=e["seq"], op=op, numel=numel, dtype=dtype, group=e["pg"], group_size=size,
                              origin=script_origin(frames, user, dtype), reduce_op=red, root=root, phase=phase_of(frames),
                              t_issue=(e["t"] - t0) / 1e9, completed=e["retired"]))
    for o in p2p:
        frames, user = raw_frames(o["frames"])
        out.append(TraceEntry(seq=o["seq"], op=o["op"], numel=o["n"], dtype=o["dt"], group=o["pg"],
                              group_size=len(groups.get(o["pg"], [])), origin=script_origin(frames, user, o["dt"]),
                              peer=o["peer"], async_op=False, phase=phase_of(frames), t_issue=(o["t"] - t0) / 1e9,
                              completed=o["done"]))
    out.sort(key=lambda e: e.t_issue)
    return out
