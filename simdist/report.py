"""The run report and per-rank collective trace shared by the simulator and the real backend.

Both sides produce a `Report`; comparing simulation with reality is then a field-by-field
diff (see `simdist.compare`). The JSON form (`Report.to_json`) is documented in
docs/report.md and is what `simdist run --json` and `simdist real --json` print.

Origin labels (`TraceEntry.origin`) name the component and code path that issued a
collective. They are declared in `simdist.vocab.ORIGINS` and derived on the real backend from the
Flight Recorder's Python frames, so the vocabulary must stay value-free (a label never
depends on a tensor's contents, which the recorder cannot see).
"""

from __future__ import annotations

import io
import math
import re
import signal
from dataclasses import asdict, dataclass, field, fields, is_dataclass
from typing import IO, Any, Literal

from simdist.jsonout import Lazy, finite, write_json
from simdist.vocab import P2P_OPS, ROOTED_OPS, Outcome, Status


@dataclass(slots=True)
class TraceEntry:
    """One collective (or p2p op) that reached a process group on one rank, in issue order.

    `seq` is the per-group sequence number (1-based, as the Flight Recorder's
    `collective_seq_id`); backends pair ranks' collectives by it. `numel` is the input
    element count (for all_gather: one rank's contribution). `root` is the global rank of
    a broadcast/reduce/gather/scatter root, `peer` the other side of a send/recv; either
    may be None where the recorder cannot know it.
    """

    seq: int
    op: str
    numel: int
    dtype: str
    group: str
    group_size: int
    origin: str
    reduce_op: str | None = None
    root: int | None = None
    peer: int | None = None
    async_op: bool = False
    phase: str = "loop"  # init | loop | join_exit | after
    iteration: int | None = None  # 0-based input index on the issuing rank, when in the loop
    t_issue: float = 0.0  # seconds since the rank started (simulated or wall)
    t_done: float | None = None  # None: never completed
    completed: bool = False
    # set on a message Gloo sends below Python for this torch call (monitored_barrier's): not
    # an operation of the trace, its `seq` is no collective's; a rank blocked in it waits in the call
    within: str | None = None

    def fingerprint(self) -> tuple:
        """What must agree across ranks for the collective to be well-formed."""
        return (self.op, self.numel, self.dtype, self.reduce_op, self.root)

    def key(self) -> tuple:
        """What sim and real traces are compared on (a p2p operation's peer too)."""
        return (self.op, self.numel, self.dtype, self.group, self.group_size, self.origin,
                self.peer if self.op in P2P_OPS else None)

    def short(self) -> str:
        extra = f" root={self.root}" if self.root is not None and self.op in ROOTED_OPS else ""
        if self.peer is not None:
            extra = f" peer={self.peer}"
        if self.within:
            return f"{self.within} on {self.group} (its own {self.op}[{self.numel}]{extra}, not traced; {self.origin})"
        return f"#{self.seq} {self.op}[{self.numel}] {self.dtype}{extra} group={self.group} ({self.origin})"


@dataclass
class RankError:
    """An exception a rank raised (or the signal that killed it).

    `category` is a stable class of failure shared by both sides, used for comparison
    where the exact text differs (addresses, ports): one of `join_early_termination`,
    `peer_lost`, `gloo_abort`, `timeout`, `model`, `killed`, `other`.
    """

    type: str
    message: str
    category: str = "other"


@dataclass
class Finding:
    """A checker finding: something suspicious that did not necessarily fail the run."""

    kind: str  # op_mismatch | size_mismatch | dtype_mismatch | reduce_op_mismatch | root_mismatch | ...
    group: str
    seq: int
    ranks: list[int]
    detail: str


@dataclass
class CodeLocation:
    """A line of the user's script (script backend): where a rank is blocked or where it left."""

    file: str
    line: int
    function: str
    code: str = ""  # the source line, stripped

    def short(self) -> str:
        text = f"{self.file.rsplit('/', 1)[-1]}:{self.line} in {self.function}"
        return f"{text}: {self.code}" if self.code else text


@dataclass
class Span:
    """A stretch of a rank's own work between communication calls: a scenario's `compute`
    step in the simulator, measured time outside the calls for a backend that times it.

    Kept in the report (not derived from gaps between collectives) because a gap can also be
    a rank waiting on an async collective; traces draw spans as compute slices."""

    t_begin: float  # seconds since the rank started, as TraceEntry.t_issue
    t_end: float
    label: str = "compute"


def phase_spans(marks: list[tuple[float, str, int | None]], t_end: float) -> list[Span]:
    """The program's phases as spans, from the marks a driver leaves at each `EnterPhase`
    ((time, phase, iteration), in order): each phase lasts until the next one begins, the
    last until `t_end`. One rule for both sides, so their iterations are cut alike."""
    ends = [m[0] for m in marks[1:]] + [t_end]
    return [Span(t, max(t, end), phase if it is None else f"{phase} {it}")
            for (t, phase, it), end in zip(marks, ends, strict=True)]


@dataclass
class RankResult:
    """What one rank did: status, inputs processed, error, observed values, its collectives."""

    rank: int
    status: Status
    inputs_processed: int = 0
    error: RankError | None = None
    observed: dict[str, Any] = field(default_factory=dict)
    trace: list[TraceEntry] = field(default_factory=list)
    time: float = 0.0  # simulated seconds (sim) or wall seconds (real)
    # A hung rank's oldest collective that never completed (what the Flight Recorder shows as
    # last completed + 1): the root of the wait, compared between sim and real.
    blocked_in: TraceEntry | None = None
    # Where the rank's code is waiting (simulator only; may be a later collective than blocked_in).
    waiting_in: TraceEntry | None = None
    warnings: list[str] = field(default_factory=list)
    # Script backend only (left out of the JSON form when unset, so scenario reports keep theirs):
    output: list[str] = field(default_factory=list)  # lines the rank printed to stdout
    stderr: list[str] = field(default_factory=list)  # lines it printed to stderr
    location: CodeLocation | None = None  # where its code is blocked (hang) or where it left
    exit: str | None = None  # how its process ended: "returned", "exception", "sys.exit(1)", "signal 9", ...
    compute: list[Span] = field(default_factory=list)  # the rank's own work between calls, in order
    # The program's phases as they ran (scenario runs): "loop <i>" per input, "join_exit",
    # "after"; what per-iteration timing (`simdist.timing.iterations`) compares.
    phases: list[Span] = field(default_factory=list)


# Left out of the JSON form when unset (so scenario reports keep theirs): the script
# backend's fields, compute spans (only ranks that computed carry them) and phases.
_OPTIONAL_RANK_FIELDS = {"output": [], "stderr": [], "location": None, "exit": None, "compute": [], "phases": []}


@dataclass
class Report:
    """What a run returns, simulated (source "sim") or real ("real"): the same type on both
    sides, so that checking, comparison, traces and JSON (docs/report.md) work on either."""

    scenario: str
    source: Literal["sim", "real"]
    outcome: Outcome
    ranks: list[RankResult]
    findings: list[Finding] = field(default_factory=list)
    backend: str = "gloo"
    world_size: int = 0
    notes: list[str] = field(default_factory=list)
    # measured wall times (script backend): e.g. wall_s, hang_detect_s; left out when empty
    timings: dict[str, float] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        if not d["timings"]:
            del d["timings"]
        for r in d["ranks"]:
            for key, default in _OPTIONAL_RANK_FIELDS.items():
                if r[key] == default:
                    del r[key]
        return d

    def to_jsonable(self) -> dict[str, Any]:
        """`to_dict`, ready for `simdist.jsonout`: non-finite floats as strings, and every
        trace a `Lazy` list whose entries are made as they are written."""
        d: dict[str, Any] = {}
        for f in fields(self):
            v = getattr(self, f.name)
            if f.name == "timings" and not v:
                continue  # as in to_dict
            d[f.name] = [_rank_jsonable(r) for r in v] if f.name == "ranks" else finite(_plain(v))
        return d

    def to_json(self, indent: int | None = 2) -> str:
        """The JSON of docs/report.md (valid JSON: see `simdist.jsonout`)."""
        out = io.StringIO()
        self.write_json(out, indent)
        return out.getvalue()

    def write_json(self, fp: IO[str], indent: int | None = 2) -> None:
        """`to_json`'s text written to `fp` in chunks, without building it (or the dicts) whole."""
        write_json(self.to_jsonable(), fp, indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        ranks = []
        for r in d["ranks"]:
            r = dict(r)
            r["trace"] = [TraceEntry(**e) for e in r.get("trace", [])]
            r["error"] = RankError(**r["error"]) if r.get("error") else None
            r["blocked_in"] = TraceEntry(**r["blocked_in"]) if r.get("blocked_in") else None
            r["waiting_in"] = TraceEntry(**r["waiting_in"]) if r.get("waiting_in") else None
            r["location"] = CodeLocation(**r["location"]) if r.get("location") else None
            r["compute"] = [Span(**c) for c in r.get("compute", [])]
            r["phases"] = [Span(**c) for c in r.get("phases", [])]
            ranks.append(RankResult(**r))
        findings = [Finding(**f) for f in d.get("findings", [])]
        return cls(**{**d, "ranks": ranks, "findings": findings})


_ENTRY_FIELDS = tuple(f.name for f in fields(TraceEntry))


def _entry_jsonable(e: TraceEntry) -> dict[str, Any]:
    d = {name: getattr(e, name) for name in _ENTRY_FIELDS}  # asdict, faster: every field is a scalar
    for name in ("t_issue", "t_done"):
        if d[name] is not None and not math.isfinite(d[name]):
            d[name] = repr(d[name])
    return d


def _plain(v: Any) -> Any:
    """asdict for a dataclass (or a list of them), the value itself otherwise."""
    if is_dataclass(v) and not isinstance(v, type):
        return asdict(v)
    if isinstance(v, list):
        return [_plain(x) for x in v]
    return v


def _rank_jsonable(r: RankResult) -> dict[str, Any]:
    d: dict[str, Any] = {}
    for f in fields(r):
        v = getattr(r, f.name)
        if f.name in _OPTIONAL_RANK_FIELDS and v == _OPTIONAL_RANK_FIELDS[f.name]:
            continue  # as in to_dict
        if f.name == "trace":
            d["trace"] = Lazy(len(v), lambda i, trace=v: _entry_jsonable(trace[i]))
        elif f.name in ("phases", "compute"):  # one span per iteration: as long as the run
            d[f.name] = Lazy(len(v), lambda i, spans=v: finite(asdict(spans[i])))
        elif isinstance(v, TraceEntry):
            d[f.name] = _entry_jsonable(v)
        else:
            d[f.name] = finite(_plain(v))
    return d


def overall_outcome(statuses: list[str]) -> Outcome:
    """Run-level outcome: any error/abort wins over a hang, which wins over completion."""
    if any(s in ("error", "aborted") for s in statuses):
        return "error"
    if any(s == "hang" for s in statuses):
        return "hang"
    return "completed"


# Files whose raising makes an exception a `model` error: DDP, ZeRO and their helpers.
MODEL_FILES = ("nn/parallel/distributed.py", "optim/zero_redundancy_optimizer.py", "torch/distributed/utils.py")


def error_category(message: str, *, runtime_error: bool, timeout_error: bool = False, in_model: bool = False) -> str:
    """`RankError.category` of an exception from its message (shared by both sides).

    `runtime_error`/`timeout_error`: the exception is a RuntimeError/TimeoutError (or a
    subclass); `in_model`: it was raised inside DDP, ZeRO or torch.distributed.utils.
    """
    if runtime_error and ("exhausted all inputs" in message or "Detected at least one rank that exhausted inputs" in message):
        return "join_early_termination"
    if any(s in message for s in ("closed by peer", "reset by peer", "Broken pipe", "Connection refused")):
        return "peer_lost"
    # "Application timeout caused pair closure": what Gloo's timeout leaves of the rank's group
    if ("Timed out" in message or "timed out" in message or "Application timeout" in message
            or "wait timeout" in message or timeout_error):  # (the last: the c10d store's, at init)
        return "timeout"
    return "model" if in_model else "other"


SHUTDOWN_ABORT = ("std::terminate during shutdown ('terminate called without an active exception', a Gloo "
                  "thread at interpreter exit), not a failure of the run")


def shutdown_abort(returncode: int | None, finished: bool, thrown: bool = False) -> bool:
    """Whether a rank's SIGABRT is Gloo at interpreter exit rather than a failure: the rank had
    finished its program and said so (a record written, an exit reported) before its process
    died of SIGABRT, with no C++ exception in flight (`thrown`: the log names one, as a Gloo
    abort mid-run does). Such a rank is reported by what it said, with `SHUTDOWN_ABORT` as a
    note; every backend that runs real processes judges its ranks by this one rule."""
    return finished and not thrown and returncode == -signal.SIGABRT


_DIGITS = re.compile(r"\d+")


def normalise_message(msg: str) -> str:
    """First line of an error message with digits replaced, for sim-vs-real comparison."""
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    return _DIGITS.sub("N", first)
