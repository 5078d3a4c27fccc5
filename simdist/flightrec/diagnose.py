"""Diagnosing a job from its Flight Recorder dumps with the checker that judges simulated runs.

`diagnose(paths)` reads the dumps (`ingest`), rebuilds the job's report (`rebuild`) and the
scenario that replays it (`replay`), then hands both to `simdist.check` exactly as
`simdist check` hands it a simulated run: the same findings (mismatch classes, ranks
missing from a collective, deadlock cycles, lost peers, errors), the same wait-for graph
cut to its deadlock core, the same explanations and hints. What only dumps have is added:

* per rank and process group, the last operation that completed and the first that never
  did (``last_completed_collective`` + 1, which is what NCCL's watchdog names);
* the ranks of each group grouped by how far they got, as NCCL's RAS prints a
  communicator's ranks ("ranks 0-2,4 at ..., rank 3 at ...");
* the Python frames of each blocked or failed call, where the dump has them (pickle form).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from simdist.check.classify import Verdict, failing_entry
from simdist.check.explain import annotate_report
from simdist.flightrec.ingest import Dumps, load_dumps
from simdist.flightrec.rebuild import Rebuilt, rebuild
from simdist.flightrec.replay import REPLAY_TIMEOUT_S, replay_scenario
from simdist.frames import is_library_file
from simdist.report import TraceEntry
from simdist.scenario import Scenario, parse_scenario
from simdist.vocab import P2P_OPS


@dataclass
class RankProgress:
    """How far one rank got on one group."""

    rank: int
    last_completed: TraceEntry | None
    first_pending: TraceEntry | None
    issued: int  # operations it issued on the group

    @property
    def key(self) -> tuple[int, int | None]:
        done = self.last_completed.seq if self.last_completed is not None else 0
        return done, self.first_pending.seq if self.first_pending is not None else None


@dataclass
class GroupProgress:
    """A group's ranks and how far each got."""

    group: str
    ranks: list[RankProgress]

    def lines(self) -> list[str]:
        """The ranks grouped by progress, most advanced first, as NCCL's RAS groups them."""
        buckets: dict[tuple[int, int | None], list[int]] = {}
        for p in self.ranks:
            buckets.setdefault(p.key, []).append(p.rank)
        out = []
        for (done, pending), ranks in sorted(buckets.items(), key=lambda kv: (-kv[0][0], kv[0][1] or 0)):
            first = next(p for p in self.ranks if p.rank == ranks[0])
            state = f"completed #{done}" if done else "completed none"
            if pending is not None and first.first_pending is not None:
                state += f", never completed #{pending} {first.first_pending.op}"
            else:
                state += ", nothing pending"
            out.append(f"{_ranks_text(ranks)}: {state}")
        return out


@dataclass
class Diagnosis:
    """What the dumps show, judged by the checker."""

    dumps: Dumps
    job: Rebuilt
    scenario: Scenario  # the job's ranks and groups, what the checker reads (no steps)
    replay: dict[str, Any]
    verdict: Verdict
    progress: list[GroupProgress] = field(default_factory=list)

    @property
    def explanation(self) -> list[str]:
        return self.job.report.notes

    def blocked_op(self, rank: int) -> TraceEntry | None:
        """The operation rank `rank` is stuck in or failed in (as `simdist check` names it)."""
        return failing_entry(self.job.report, rank)

    def frame_lines(self, rank: int, limit: int = 12) -> list[str]:
        """The Python frames of the rank's blocked or failed call, innermost first; user code marked."""
        frames = self.job.frames.get(rank, [])
        out = [f"{'  ' if is_library_file(f.filename) else '> '}{f.name} at {f.filename}:{f.line}"
               for f in frames[:limit]]
        if len(frames) > limit:
            out.append(f"  ... {len(frames) - limit} more")
        return out

    def to_dict(self) -> dict[str, Any]:
        return {
            "files": {str(r): str(d.path) for r, d in sorted(self.dumps.dumps.items())},
            "error_files": {str(r): str(e.path) for r, e in sorted(self.dumps.errors.items())},
            "format_version": self.dumps.version,
            "backend": self.dumps.backend,
            "world_size": self.dumps.world_size,
            "groups": {g.name: {"ranks": g.ranks, "torch_name": g.torch_name, "desc": g.desc} for g in self.job.groups},
            "verdict": self.verdict.to_dict(),
            "progress": {p.group: [{"rank": x.rank, "issued": x.issued,
                                    "last_completed": asdict(x.last_completed) if x.last_completed else None,
                                    "first_pending": asdict(x.first_pending) if x.first_pending else None}
                                   for x in p.ranks] for p in self.progress},
            "ras": {p.group: p.lines() for p in self.progress},
            "frames": {str(r): [{"name": f.name, "filename": f.filename, "line": f.line} for f in fs]
                       for r, fs in sorted(self.job.frames.items())},
            "explanation": self.explanation,
            "report": self.job.report.to_dict(),
        }


def diagnose(paths: list[Path], name: str | None = None, timeout_s: float = REPLAY_TIMEOUT_S) -> Diagnosis:
    """Read the dumps under `paths` and judge them (DumpError for a file that is not a dump)."""
    dumps = load_dumps(paths)
    where = "+".join(p.name or str(p) for p in paths)
    job = rebuild(dumps, name or f"Flight Recorder dumps in {where}")
    replay = replay_scenario(job, name=_stem(f"replay-{where}"), description=_description(dumps, paths),
                             timeout_s=timeout_s)
    scenario = parse_scenario(job_scenario(replay), source="dumps")
    verdict = annotate_report(job.report, scenario)
    return Diagnosis(dumps, job, scenario, replay, verdict, progress(job))


def job_scenario(replay: dict[str, Any]) -> dict[str, Any]:
    """What the checker may know of the job: its ranks and groups -- not the replay's steps,
    which say where the ranks went apart, not what their program is (the checker's family
    hints then come from the traces, `simdist.check.trace_hints`)."""
    keep = ("name", "world_size", "backend", "inputs", "groups", "on_finish")
    return {k: v for k, v in replay.items() if k in keep}


def progress(job: Rebuilt) -> list[GroupProgress]:
    """Per group, each member's last completed and first never-completed operation."""
    out = []
    for g in job.groups:
        ranks = []
        for m in g.ranks:
            trace = [e for e in job.report.ranks[m].trace if e.group == g.name and e.op not in P2P_OPS]
            done = [e for e in trace if e.completed]
            ranks.append(RankProgress(m, done[-1] if done else None, next((e for e in trace if not e.completed), None),
                                      len(trace)))
        out.append(GroupProgress(g.name, ranks))
    return out


def _ranks_text(ranks: list[int]) -> str:
    """``rank 3`` or ``ranks 0-2,4`` (consecutive ranks as ranges, as NCCL's RAS writes them)."""
    if len(ranks) == 1:
        return f"rank {ranks[0]}"
    parts, start = [], ranks[0]
    for a, b in zip(ranks, ranks[1:] + [None], strict=True):
        if b != a + 1:
            parts.append(f"{start}-{a}" if a != start else str(a))
            start = b
    return f"ranks {','.join(parts)}"


def _stem(title: str) -> str:
    return "".join(c if c.isalnum() or c in "-_." else "-" for c in title).strip("-") or "replay"


def _description(dumps: Dumps, paths: list[Path]) -> str:
    return (f"Replay of the Flight Recorder dumps in {', '.join(map(str, paths))} ({dumps.world_size} ranks, "
            f"{dumps.backend}, format {dumps.version}): each rank's operations as its dump records them, up to "
            "where it stopped. Written by simdist diagnose --replay.")
