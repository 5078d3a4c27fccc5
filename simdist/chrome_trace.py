"""Chrome trace JSON (opens in Perfetto / chrome://tracing): one track per rank.

Each collective is a complete event ("X") from issue to completion on its rank's track;
collectives that never completed end at the rank's last time and are marked as blocked.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from simdist.report import Report


def to_chrome_trace(report: Report) -> dict[str, Any]:
    events: list[dict[str, Any]] = []
    end = max((r.time for r in report.ranks), default=0.0)
    for r in report.ranks:
        events.append({"name": "thread_name", "ph": "M", "pid": 0, "tid": r.rank, "args": {"name": f"rank {r.rank}"}})
        for e in r.trace:
            t_done = e.t_done if e.t_done is not None else max(end, e.t_issue)
            events.append(
                {
                    "name": f"{e.op}[{e.numel}] {e.origin}",
                    "cat": e.origin.split(".")[0],
                    "ph": "X",
                    "pid": 0,
                    "tid": r.rank,
                    "ts": e.t_issue * 1e6,
                    "dur": max(t_done - e.t_issue, 0.0) * 1e6,
                    "args": {"seq": e.seq, "group": e.group, "dtype": e.dtype, "completed": e.completed,
                             "phase": e.phase, "iteration": e.iteration},
                }
            )
        if r.status != "completed":
            events.append({"name": r.status, "ph": "i", "s": "t", "pid": 0, "tid": r.rank, "ts": r.time * 1e6,
                           "args": {"error": r.error.message if r.error else None}})
    return {"traceEvents": events, "displayTimeUnit": "ms", "otherData": {"scenario": report.scenario,
                                                                           "source": report.source}}


def write_chrome_trace(report: Report, path: str | Path) -> None:
    Path(path).write_text(json.dumps(to_chrome_trace(report)))
