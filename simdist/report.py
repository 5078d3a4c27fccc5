"""The run report and per-rank collective trace shared by the simulator and the real backend.

Both sides produce a `Report`; comparing simulation with reality is then a field-by-field
diff (see `simdist.compare`). The JSON form (`Report.to_json`) is documented in
docs/report.md and is what `simdist run --json` and `simdist real --json` print.

Origin labels (`TraceEntry.origin`) name the component and code path that issued a
collective. They are defined in `ORIGINS` below and derived on the real backend from the
Flight Recorder's Python frames, so the vocabulary must stay value-free (a label never
depends on a tensor's contents, which the recorder cannot see).
"""

from __future__ import annotations

import json
import re
from dataclasses import asdict, dataclass, field
from typing import Any, Literal

Status = Literal["completed", "error", "hang", "aborted"]
Outcome = Literal["completed", "hang", "error"]

# Every origin label either side may emit. `user.<name>` labels (raw collective and p2p
# steps) are added per scenario: the step's `name`, or `step<index>` in its section, e.g.
# `user.loop[3]` / `user.after[0]`.
ORIGINS: dict[str, str] = {
    "ddp.init.verify_params": "DDP constructor: _verify_param_shape_across_processes (all_gather + broadcast)",
    "ddp.init.sync_module_states": "DDP constructor: _sync_module_states broadcast from rank 0",
    "join.notify_join_context.heartbeat": "Join.notify_join_context: async all-reduce of ones (first joinable only)",
    "join.notify_join_context.throw_check": "Join.notify_join_context: all-reduce of zeros (throw_on_early_termination)",
    "join.exit.count_nonjoined": "Join.__exit__: all-reduce of zeros counting non-joined ranks",
    "join.exit.notify_terminate": "Join.__exit__: all-reduce of ones before raising (throw_on_early_termination)",
    "ddp.pre_forward.rebuild_buckets": "DDP _pre_forward: reducer._rebuild_buckets broadcasts (2nd iteration)",
    "ddp.pre_forward.find_common_rank": "DDP _pre_forward: buffer sync authoritative rank (all-reduce MAX)",
    "ddp.pre_forward.sync_buffers": "DDP _pre_forward: buffer broadcast",
    "ddp.pre_forward.requires_grad_sync": "DDP _pre_forward: backward-sync flag all-reduce (Join enabled)",
    "ddp.backward.bucket_allreduce": "DDP reducer: gradient bucket all-reduce",
    "ddp.backward.unused_map_allreduce": "DDP reducer: local-used map all-reduce (find_unused_parameters)",
    "ddp.join_hook.rebuild_buckets": "DDP join hook: reducer._rebuild_buckets broadcasts",
    "ddp.join_hook.find_common_rank": "DDP join hook: buffer sync authoritative rank",
    "ddp.join_hook.sync_buffers": "DDP join hook: buffer broadcast",
    "ddp.join_hook.requires_grad_sync": "DDP join hook: backward-sync flag all-reduce (zeros)",
    "ddp.join_hook.bucket_allreduce": "DDP join hook: shadow gradient bucket all-reduce (zeros)",
    "ddp.join_hook.unused_map_allreduce": "DDP join hook: shadow local-used map all-reduce",
    "ddp.post_hook.find_common_rank": "DDP join post hook: last joiner (all-reduce MAX)",
    "ddp.post_hook.broadcast_final_model": "DDP join post hook: final model broadcast from the last joiner",
    "zero.step.broadcast_shard": "ZeroRedundancyOptimizer.step: broadcast of each rank's parameter shard",
    "zero.join_hook.broadcast_shard": "ZeRO join hook: step() shadowing the shard broadcasts",
    "counter.call.allreduce": "Counter.__call__: all-reduce of ones",
    "counter.main_hook.allreduce": "Counter join hook: shadow all-reduce of zeros",
    "counter.post_hook.find_common_rank": "Counter post hook: last joiner (all-reduce MAX)",
    "counter.post_hook.broadcast_max_count": "Counter post hook: broadcast of max_count",
    "allreducer.call.allreduce": "AllReducer.__call__: all-reduce of ones",
    "allreducer.main_hook.allreduce": "AllReducer join hook: shadow all-reduce of zeros",
    "allreducer.post_hook.find_common_rank": "AllReducer post hook (run_post_hooks): last joiner (all-reduce MAX)",
    "allreducer.post_hook.broadcast": "AllReducer post hook (run_post_hooks): broadcast of post_hook_tensor",
}


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

    def fingerprint(self) -> tuple:
        """What must agree across ranks for the collective to be well-formed."""
        return (self.op, self.numel, self.dtype, self.reduce_op, self.root)

    def key(self) -> tuple:
        """What sim and real traces are compared on."""
        return (self.op, self.numel, self.dtype, self.group, self.group_size, self.origin)

    def short(self) -> str:
        extra = f" root={self.root}" if self.root is not None and self.op in ("broadcast", "reduce", "gather", "scatter") else ""
        if self.peer is not None:
            extra = f" peer={self.peer}"
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
class RankResult:
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


@dataclass
class Report:
    scenario: str
    source: Literal["sim", "real"]
    outcome: Outcome
    ranks: list[RankResult]
    findings: list[Finding] = field(default_factory=list)
    backend: str = "gloo"
    world_size: int = 0
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self)

    def to_json(self, indent: int | None = 2) -> str:
        return json.dumps(self.to_dict(), indent=indent)

    @classmethod
    def from_dict(cls, d: dict[str, Any]) -> Report:
        ranks = []
        for r in d["ranks"]:
            r = dict(r)
            r["trace"] = [TraceEntry(**e) for e in r.get("trace", [])]
            r["error"] = RankError(**r["error"]) if r.get("error") else None
            r["blocked_in"] = TraceEntry(**r["blocked_in"]) if r.get("blocked_in") else None
            r["waiting_in"] = TraceEntry(**r["waiting_in"]) if r.get("waiting_in") else None
            ranks.append(RankResult(**r))
        findings = [Finding(**f) for f in d.get("findings", [])]
        return cls(**{**d, "ranks": ranks, "findings": findings})


def overall_outcome(statuses: list[str]) -> Outcome:
    """Run-level outcome: any error/abort wins over a hang, which wins over completion."""
    if any(s in ("error", "aborted") for s in statuses):
        return "error"
    if any(s == "hang" for s in statuses):
        return "hang"
    return "completed"


_DIGITS = re.compile(r"\d+")


def normalise_message(msg: str) -> str:
    """First line of an error message with digits replaced, for sim-vs-real comparison."""
    first = msg.strip().splitlines()[0] if msg.strip() else ""
    return _DIGITS.sub("N", first)
