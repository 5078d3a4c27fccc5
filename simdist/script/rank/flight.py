"""The Flight Recorder of a rank on real Gloo (the script backend's "gloo" mode), read at exit.

Sent to the coordinator with the rank's exit, so the same script's collective sequence on
real Gloo can be set beside the simulated one (origins from the same frames classifier).
"""

from __future__ import annotations

import pickle
from typing import Any

import torch
import torch.distributed as dist

from simdist.script import env
from simdist.script.rank import stack


def _groups() -> dict[str, list[int]]:
    world = dist.distributed_c10d._world
    out = {}
    for group, ranks in world.pg_group_ranks.items():
        name = world.pg_names.get(group)
        if name is not None:
            out[env.group_name(str(name), group is world.default_pg)] = sorted(ranks)
    return out


def dump() -> dict[str, Any]:
    """This rank's collectives as FR recorded them (p2p excluded: Gloo's FR has none)."""
    if not dist.is_initialized():
        return {}
    d = pickle.loads(torch._C._distributed_c10d._dump_fr_trace())
    entries = []
    for e in d.get("entries", []):
        if e.get("is_p2p"):
            continue
        pg = e.get("process_group") or (str(e.get("pg_id")), "")
        frames = [[f.get("filename", ""), int(f.get("line", 0)), f.get("name", ""),
                   stack.is_user_file(f.get("filename", ""))] for f in e.get("frames") or []]
        entries.append({"seq": int(e["collective_seq_id"]), "pg": env.group_name(str(pg[0]), pg[1] == "default_pg"),
                        "op": e["profiling_name"], "sizes": e.get("input_sizes") or [],
                        "dtypes": e.get("input_dtypes") or [], "frames": frames, "retired": bool(e.get("retired")),
                        "t": int(e.get("time_created_ns") or 0)})
    return {"entries": entries, "groups": _groups()}
