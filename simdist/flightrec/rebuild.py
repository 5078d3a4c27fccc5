"""From a job's dumps to the `Report` simdist's checker reads: what each rank did, in simdist's terms.

* **Groups.** A dump's entries name their process group (torch's name, its description);
  ``pg_config`` gives the ranks where the backend records them (NCCL). Gloo's names none,
  so a group's members are the ranks whose dumps show it, and the default group is every
  rank. The default group is called WORLD, another by its description (``group_desc``).
* **Operations.** Each entry becomes a `TraceEntry`: op and size from ``profiling_name`` and
  ``input_sizes``, ``collective_seq_id`` as its sequence number (``p2p_seq_id`` for send and
  recv), the origin and phase from its Python frames where the pickle form has them
  (`simdist.frames`: DDP's bucket all-reduce, Join's heartbeat, or ``user.<file>:<line>``).
  FR records neither the reduce op nor the root: they stay unknown (None).
* **Completion.** ``state == "completed"`` (NCCL); Gloo leaves ``state`` at "scheduled" and
  sets ``retired`` when the work ends -- also when it failed, so a rank whose error file
  says it lost a peer or timed out did not complete its last operation (the real backend's
  rule, `real_backend.worker`).
* **Status.** An error file: the rank raised (``error``). Else an operation that never
  completed: the rank is blocked in the first one (``hang``, `blocked_in`). Else it got
  through everything it issued (``completed``). No dump at all: it left no record (``aborted``).
* **Mismatches** the engine reports while pairing, found the same way in the traces: every
  member issued sequence number s on a group and their calls differ (`simdist.check.pairing`).
"""

from __future__ import annotations

import linecache
from dataclasses import dataclass, field
from typing import Any

from simdist.check.pairing import trace_mismatches
from simdist.flightrec.format import (
    COALESCED,
    DEFAULT_PG_DESC,
    UNDEFINED_DESC,
    fr_backend,
    fr_dtype,
    fr_numel,
    fr_op_name,
    fr_p2p_ranks,
)
from simdist.flightrec.ingest import Dumps, ErrorFile, parse_ranks
from simdist.frames import Frame, is_library_file, phase_of, resolve_frames, script_origin
from simdist.report import MODEL_FILES, CodeLocation, RankError, RankResult, Report, TraceEntry, error_category
from simdist.schema import CollectiveStep
from simdist.vocab import COLLECTIVE_OPS, P2P_OPS, WORLD, is_declared_origin

# The key under which `simdist.flightrec.export` keeps an entry's origin label (torch's
# analyzer ignores keys it does not know), so that simdist reads its own dumps back whole.
ORIGIN_KEY = "simdist_origin"
BARRIER_DTYPE = CollectiveStep.model_fields["dtype"].default  # a barrier has no tensor: the scenario default
_RUNTIME_ERRORS = {"RuntimeError", "DistError", "DistBackendError", "DistNetworkError", "DistStoreError"}


@dataclass
class PG:
    """A process group as the dumps name it, and simdist's name for it."""

    name: str  # simdist's: WORLD, the description, or pg<torch name>
    torch_name: str
    desc: str
    ranks: list[int]


@dataclass
class Rebuilt:
    """The job as simdist's checker sees it, with what only the dumps know."""

    report: Report
    groups: list[PG]
    frames: dict[int, list[Frame]] = field(default_factory=dict)  # rank -> frames of its failing call

    def group_ranks(self, name: str) -> list[int]:
        for g in self.groups:
            if g.name == name:
                return g.ranks
        raise KeyError(name)


def rebuild(dumps: Dumps, name: str = "flight-recorder dumps") -> Rebuilt:
    """The report of the job whose dumps (and error files) these are."""
    groups = _groups(dumps)
    by_torch = {g.torch_name: g for g in groups}
    t0 = min((int(e.get("time_created_ns") or 0) for d in dumps.dumps.values() for e in d.entries), default=0)
    ranks: list[RankResult] = []
    frames: dict[int, list[Frame]] = {}
    for r in range(dumps.world_size):
        d = dumps.dumps.get(r)
        if d is None:
            ranks.append(RankResult(r, "aborted", error=RankError("NoDump", "left no Flight Recorder dump", "killed")))
            continue
        trace, raw = _trace(d.entries, by_torch, t0)
        ranks.append(_rank_result(r, trace, dumps.errors.get(r)))
        failing = ranks[-1].blocked_in or next((e for e in reversed(trace) if not e.completed), None)
        if failing is not None:
            frames[r] = raw[id(failing)]
            ranks[-1].location = _user_location(frames[r])
    statuses = [r.status for r in ranks]
    outcome = "error" if any(s in ("error", "aborted") for s in statuses) else \
        "hang" if "hang" in statuses else "completed"
    report = Report(scenario=name, source="real", outcome=outcome, ranks=ranks, backend=dumps.backend,
                    world_size=dumps.world_size, notes=list(dumps.notes))
    out = Rebuilt(report, groups, frames)
    report.findings = trace_mismatches(report, out)  # type: ignore[arg-type] - it names groups as a scenario does
    report.notes += _failed_without_error_file(out, dumps)
    return out


# --------------------------------------------------------------------------- groups
def _groups(dumps: Dumps) -> list[PG]:
    seen: dict[str, tuple[str, set[int], list[int]]] = {}  # torch name -> (desc, ranks seen, configured ranks)
    for r, d in sorted(dumps.dumps.items()):
        config = {str(k): v for k, v in (d.doc.get("pg_config") or {}).items() if isinstance(v, dict)}
        for e in d.entries:
            pg_name, desc = _pg_of(e)
            old = seen.get(pg_name, (desc, set(), []))
            configured = parse_ranks(config.get(pg_name, {}).get("ranks")) or old[2]
            seen[pg_name] = (old[0] if old[0] != UNDEFINED_DESC else desc, old[1] | {r}, configured)
    groups: list[PG] = []
    names: set[str] = set()
    for pg_name, (desc, ranks_seen, configured) in sorted(seen.items(), key=lambda kv: _natural(kv[0])):
        if desc == DEFAULT_PG_DESC:
            name, ranks = WORLD, list(range(dumps.world_size))
        else:
            name = desc if desc and desc not in (UNDEFINED_DESC, WORLD) and desc not in names else f"pg{pg_name}"
            # torch's pg_config lists them in group-rank order (new_group's sort_ranks=False
            # keeps the given one), which p2p ends and roots index: only the ranks seen sorted
            ranks = list(configured) if configured else sorted(ranks_seen)
        names.add(name)
        groups.append(PG(name, pg_name, desc, ranks))
    return groups


def _pg_of(e: dict[str, Any]) -> tuple[str, str]:
    pg = e.get("process_group")
    if isinstance(pg, (list, tuple)) and len(pg) == 2:
        return str(pg[0]), str(pg[1])
    pg_id = str(e.get("pg_id", 0))  # releases before process_group names
    return pg_id, DEFAULT_PG_DESC if pg_id == "0" else UNDEFINED_DESC


def _natural(name: str) -> tuple[int, int | str]:
    return (0, int(name)) if name.isdigit() else (1, name)


# --------------------------------------------------------------------------- one rank
def _trace(entries: list[dict[str, Any]], groups: dict[str, PG], t0: int
           ) -> tuple[list[TraceEntry], dict[int, list[Frame]]]:
    """A rank's operations in issue order, and the frames of each (by id of its entry).
    A coalesced group (NCCL: ops sharing one sequence number, then a ``coalesced`` marker)
    counts as its first op with the group's total size, as it is one operation on the wire."""
    trace: list[TraceEntry] = []
    frames: dict[int, list[Frame]] = {}
    for e in sorted(entries, key=lambda x: int(x.get("record_id", 0))):
        op = fr_op_name(str(e["profiling_name"]))
        g = groups[_pg_of(e)[0]]
        p2p = bool(e.get("is_p2p")) or op in P2P_OPS
        seq = int(e.get("p2p_seq_id", 0) if p2p else e["collective_seq_id"])
        done = _completed(e)
        last = trace[-1] if trace else None
        if last is not None and not p2p and last.group == g.name and last.seq == seq and last.op not in P2P_OPS:
            if op != COALESCED:  # one more op of a coalesced group
                last.numel += fr_numel(e.get("input_sizes") or [])
            last.completed = last.completed and done
            continue
        if op == COALESCED or (op not in COLLECTIVE_OPS and op not in P2P_OPS):
            continue  # an op simdist has no name for (e.g. split, new_window): not a collective it pairs
        raw = resolve_frames(e.get("frames") or [])
        dtype = BARRIER_DTYPE if op == "barrier" else fr_dtype(e.get("input_dtypes") or e.get("output_dtypes") or [])
        origin = str(e.get(ORIGIN_KEY) or "")
        if not is_declared_origin(origin):
            origin = script_origin(raw, [not is_library_file(f.filename) for f in raw], dtype)
        entry = TraceEntry(
            seq=seq, op=op, numel=0 if op == "barrier" else fr_numel(e.get("input_sizes") or e.get("output_sizes") or []),
            dtype=dtype, group=g.name, group_size=len(g.ranks), origin=origin, peer=_peer(e, op, g),
            phase=phase_of(raw), t_issue=(int(e.get("time_created_ns") or t0) - t0) / 1e9, completed=done,
        )
        trace.append(entry)
        frames[id(entry)] = raw
    for k, entry in enumerate(trace):  # FR does not time completions: the next issue bounds it
        if entry.completed:
            entry.t_done = trace[k + 1].t_issue if k + 1 < len(trace) else entry.t_issue
    return trace, frames


def _completed(e: dict[str, Any]) -> bool:
    """Whether an entry's work completed: its state says so (NCCL, whose retired-but-not-completed
    entries timed out), or, where the state never moves (Gloo) or is not recorded, it retired."""
    state = e.get("state")
    if state is None or state == "completed":
        return state == "completed" or bool(e.get("retired"))
    return bool(e.get("retired")) and fr_backend(str(e.get("profiling_name", ""))) == "gloo"


def _peer(e: dict[str, Any], op: str, g: PG) -> int | None:
    if op not in P2P_OPS:
        return None
    ends = fr_p2p_ranks(str(e["profiling_name"]))
    if ends is None:
        return None
    local = ends[1] if op == "send" else ends[0]
    return g.ranks[local] if 0 <= local < len(g.ranks) else None


def _rank_result(r: int, trace: list[TraceEntry], err: ErrorFile | None) -> RankResult:
    if err is not None:
        error = rank_error(err)
        if error.category in ("peer_lost", "timeout") and trace and trace[-1].completed:
            trace[-1].completed, trace[-1].t_done = False, None  # retired because it failed
        return RankResult(r, "error", error=error, trace=trace)
    pending = [e for e in trace if not e.completed]
    if pending:
        waiting = pending[-1] if pending[-1] is not pending[0] else None
        return RankResult(r, "hang", trace=trace, blocked_in=pending[0], waiting_in=waiting)
    return RankResult(r, "completed", trace=trace)


def rank_error(err: ErrorFile) -> RankError:
    """A RankError from torchelastic's record of the exception, categorised as both backends do."""
    last_file = ""
    for line in err.callstack.splitlines():
        if line.strip().startswith('File "'):
            last_file = line.strip().split('"')[1]
    return RankError(err.type, err.message, error_category(
        err.message, runtime_error=err.type in _RUNTIME_ERRORS, timeout_error="Timeout" in err.type,
        in_model=last_file.replace("\\", "/").endswith(MODEL_FILES)))


def _user_location(frames: list[Frame]) -> CodeLocation | None:
    """The innermost frame of the user's own code (where the rank's program waits)."""
    f = next((f for f in frames if not is_library_file(f.filename)), None)
    if f is None:
        return None
    return CodeLocation(f.filename, f.line, f.name, linecache.getline(f.filename, f.line).strip())


# --------------------------------------------------------------------------- across ranks
def _failed_without_error_file(job: Rebuilt, dumps: Dumps) -> list[str]:
    """Gloo retires failed work as finished: a retired collective that a live member never
    issued most likely failed. Without the error file that says so, say it in words."""
    notes = []
    index = [{(e.group, e.seq) for e in r.trace} for r in job.report.ranks]
    for r in job.report.ranks:
        if r.rank in dumps.errors or not r.trace or not r.trace[-1].completed or r.trace[-1].op in P2P_OPS:
            continue
        last = r.trace[-1]
        absent = [m for m in job.group_ranks(last.group) if m in dumps.dumps and (last.group, last.seq) not in index[m]]
        if absent:
            notes.append(f"rank {r.rank}'s last operation {last.short()} retired although rank(s) {absent} never "
                         "issued it: it most likely failed (a lost peer); the rank's error file would say")
    return notes
