"""Writing a simdist run (simulated or real) as the per-rank Flight Recorder dumps torch writes.

The dumps are what torch 2.13's recorder would have written for the run's operations (format
2.10, the keys and value shapes of `_dump_fr_trace`), in files named as torch's
DebugInfoWriter names them (``<prefix><rank>``), so that torch's own analyzer
(``torchfrtrace DIR``, i.e. ``python -m torch.distributed.flight_recorder.fr_trace DIR``)
reads them. Where torch's Gloo recorder leaves something out, the export writes it the way
NCCL's recorder does, because the analyzer needs it:

* ``pg_config`` lists each group's ranks (Gloo's names none, and the analyzer then fails);
* ``state`` is "completed" for an operation that completed, else "scheduled" (Gloo's never
  moves), so the analyzer can tell where each rank stopped.

Gloo's recorder has no send/recv; neither has a Gloo export (an NCCL run's has them, named
``nccl:send 0->1`` with the peers' group ranks). Each entry's frames hold one line naming
its origin, and the origin itself under ``simdist_origin`` (the analyzer ignores keys it
does not know; `simdist diagnose` reads it back). A rank that raised also gets the error
file torchelastic would have written (``<rank>/error.json``), which the analyzer skips.
"""

from __future__ import annotations

import json
import os
import pickle
import time
from pathlib import Path
from typing import Any, Literal

from simdist.flightrec.format import (
    DEFAULT_DUMP_PREFIX,
    DEFAULT_PG_DESC,
    ERROR_FILE_NAME,
    FORMAT_VERSION,
    dump_path,
)
from simdist.flightrec.rebuild import ORIGIN_KEY
from simdist.report import Report, TraceEntry
from simdist.scenario import Scenario
from simdist.vocab import P2P_OPS, TORCH_DTYPE_NAMES, WORLD

PG_TIMEOUT_MS = 1_800_000  # torch's default process-group timeout, what an entry's timeout_ms holds
Form = Literal["pickle", "json"]


def export_dumps(report: Report, scenario: Scenario) -> dict[int, dict[str, Any]]:
    """Each rank's dump (the dict torch pickles) for the run `report` of `scenario`."""
    names = [WORLD] + [g.name for g in scenario.groups]
    pgs = {name: (str(k), DEFAULT_PG_DESC if name == WORLD else name, scenario.group_ranks(name))
           for k, name in enumerate(names)}
    t0 = time.time_ns()
    return {r.rank: _rank_dump(report, r.rank, pgs, t0) for r in report.ranks}


def _rank_dump(report: Report, rank: int, pgs: dict[str, tuple[str, str, list[int]]], t0: int) -> dict[str, Any]:
    mine = {name: pg for name, pg in pgs.items() if rank in pg[2]}
    entries: list[dict[str, Any]] = []
    op_ids: dict[str, int] = {}
    last_seq: dict[str, int] = {}
    status: dict[str, dict[str, int]] = {}
    for e in report.ranks[rank].trace:
        if e.group not in mine or (e.op in P2P_OPS and report.backend == "gloo"):
            continue  # Gloo's recorder has no send/recv
        pg_name, desc, members = mine[e.group]
        op_ids[e.group] = op_ids.get(e.group, 0) + 1
        p2p = e.op in P2P_OPS
        if not p2p:
            last_seq[e.group] = e.seq
        entries.append(_entry(report.backend, rank, e, len(entries), list(pgs).index(e.group), (pg_name, desc),
                              members, last_seq.get(e.group, 0), op_ids[e.group], t0, report.source))
        st = status.setdefault(str(list(pgs).index(e.group)), {"last_enqueued_collective": -1,
                                                               "last_started_collective": -1,
                                                               "last_completed_collective": -1})
        if not p2p:
            st["last_enqueued_collective"] = e.seq
            if e.completed:
                st["last_completed_collective"] = e.seq
    return {
        "version": FORMAT_VERSION,
        "pg_config": {pg: {"name": pg, "desc": desc, "ranks": str(members)} for pg, desc, members in mine.values()},
        "comm_lib_version": "",
        "pg_status": status,
        "entries": entries,
    }


def _entry(backend: str, rank: int, e: TraceEntry, record_id: int, pg_id: int, pg: tuple[str, str],
           members: list[int], collective_seq: int, op_id: int, t0: int, source: str) -> dict[str, Any]:
    """One entry as torch records it (`members`: the group's global ranks, in group-rank order)."""
    p2p = e.op in P2P_OPS
    name = f"{backend}:{e.op}"
    if p2p and e.peer in members:
        me, peer = members.index(rank), members.index(e.peer)  # type: ignore[arg-type]
        name += f" {me}->{peer}" if e.op == "send" else f" {me}<-{peer}"
    ins, outs = _sizes(e, len(members))
    dtype = [] if e.op == "barrier" else [TORCH_DTYPE_NAMES.get(e.dtype, e.dtype.capitalize())]
    return {
        "record_id": record_id, "pg_id": pg_id, "process_group": pg, "thread_name": "python", "thread_id": "1",
        "collective_seq_id": collective_seq, "p2p_seq_id": e.seq if p2p else 0, "op_id": op_id,
        "profiling_name": name, "time_created_ns": t0 + int(e.t_issue * 1e9),
        "input_sizes": ins, "input_dtypes": dtype, "output_sizes": outs, "output_dtypes": dtype,
        "state": "completed" if e.completed else "scheduled",
        "time_discovered_started_ns": None, "time_discovered_completed_ns": None,
        "retired": e.completed, "timeout_ms": PG_TIMEOUT_MS, "is_p2p": p2p,
        "frames": [{"name": e.origin, "filename": f"<simdist {source} run>", "line": 0}],
        ORIGIN_KEY: e.origin,
    }


def _sizes(e: TraceEntry, w: int) -> tuple[list[list[int]], list[list[int]]]:
    """(input sizes, output sizes) as torch records them for the op."""
    n = e.numel
    if e.op == "barrier":
        return [], []
    if e.op in ("all_gather", "gather"):
        return [[n]], [[w, n]]
    if e.op == "reduce_scatter":
        return [[n]], [[n // w]]
    if e.op == "scatter":
        return [[w, n // w]], [[n // w]]
    return [[n]], [[n]]


def write_dumps(docs: dict[int, dict[str, Any]], folder: Path, prefix: str = DEFAULT_DUMP_PREFIX,
                form: Form = "pickle") -> list[Path]:
    """Write each rank's dump to ``folder/<prefix><rank>`` (JSON: with ``.json``), as torch does."""
    folder.mkdir(parents=True, exist_ok=True)
    out = []
    for rank, doc in sorted(docs.items()):
        path = Path(dump_path(str(folder / prefix), rank) + (".json" if form == "json" else ""))
        if form == "json":
            data = json.dumps({**doc, "entries": [_json_entry(e) for e in doc["entries"]],
                               "nccl_comm_state": {}}, sort_keys=True).encode()
        else:
            data = pickle.dumps(doc, protocol=2)
        tmp = path.with_name(path.name + ".writing")
        tmp.write_bytes(data)
        os.replace(tmp, path)
        out.append(path)
    return out


def _json_entry(e: dict[str, Any]) -> dict[str, Any]:
    """An entry as torch's JSON form has it: no frames, 0 for unset times."""
    j = {k: v for k, v in e.items() if k != "frames"}
    j["time_discovered_started_ns"] = j["time_discovered_started_ns"] or 0
    j["time_discovered_completed_ns"] = j["time_discovered_completed_ns"] or 0
    return j


def write_error_files(report: Report, folder: Path) -> list[Path]:
    """Each rank's exception as torchelastic's ErrorHandler writes it (``<folder>/<rank>/error.json``)."""
    out = []
    for r in report.ranks:
        if r.error is None or r.status != "error":
            continue
        path = folder / str(r.rank) / ERROR_FILE_NAME
        path.parent.mkdir(parents=True, exist_ok=True)
        doc = {"message": {"message": f"{r.error.type}: {r.error.message}",
                           "extraInfo": {"py_callstack": "", "timestamp": str(int(time.time()))}}}
        path.write_text(json.dumps(doc))
        out.append(path)
    return out
