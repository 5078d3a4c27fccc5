"""Gloo's `monitored_barrier` on a simulated group, message for message as
ProcessGroupGloo::monitoredBarrier runs it (torch 2.13), with its errors' wording.

Every rank but 0 sends rank 0 a tensor and waits for its answer (with the group's own
timeout); rank 0 receives from ranks 1, 2, ... in order, each with a deadline: `timeout`
from the barrier's start, or with `wait_all_ranks` the whole `timeout` for each wait in
turn. Without `wait_all_ranks` the first rank that missed its deadline is named at once;
with it every one is, after all were waited for. Rank 0 answers only when every rank
arrived, so a barrier passes everywhere or nowhere. The deadlines are simulated time
(`simdist.script.deadlines`). Gloo runs these messages below Python and its Flight
Recorder, so they are not in the rank's trace (`hidden`), as on real Gloo.
"""

from __future__ import annotations

from typing import Any

import torch

ARRIVE_TAG, ANSWER_TAG = -1, -2  # Gloo's own collective tags: never a script's (tags are >= 0)


def _p2p(pg: Any, op: str, peer: int, tag: int, limit_s: float | None = None) -> Any:
    t = torch.tensor([pg.rank()])
    inputs, outputs = ([t], []) if op == "send" else ([], [t])
    return pg._issue(op, inputs, outputs, [t], numel=1, dtype="int64", send=op == "send",
                     peer=pg.global_ranks[peer], tag=tag, limit_s=limit_s, hidden="monitored_barrier")


def _wait_all(works: dict[int, Any], limit_s: float, ms: int, wait_all_ranks: bool) -> None:
    """Gloo's waitLoop: wait for each rank's message in rank order; name who missed it."""
    failed = []
    for r, work in works.items():
        if wait_all_ranks:
            work.wait_limit_s = limit_s  # each wait gets the whole timeout, from when it starts
        try:
            work.wait()
        except RuntimeError as e:
            error = f"[Rank 0]: Rank {r} failed to pass monitoredBarrier in {ms} ms"
            if not wait_all_ranks:
                raise RuntimeError(f"{error}\n Original exception: \n{e}") from None
            failed.append(r)
    if failed:
        raise RuntimeError(f"[Rank 0]: Ranks {', '.join(map(str, failed))} failed to pass monitoredBarrier in {ms} ms")


def barrier(pg: Any, timeout: Any, wait_all_ranks: bool) -> None:
    limit_s = timeout.total_seconds()
    ms = round(limit_s * 1000)
    rank = pg.rank()
    if rank != 0:
        works = [_p2p(pg, "send", 0, ARRIVE_TAG), _p2p(pg, "recv", 0, ANSWER_TAG)]
        try:
            for work in works:
                work.wait()
        except RuntimeError as e:
            raise RuntimeError(f"Rank {rank} successfully reached monitoredBarrier, but received errors while "
                               "waiting for send/recv from rank 0. Please check rank 0 logs for faulty rank.\n"
                               f" Original exception: \n{e}") from None
        return
    # without wait_all_ranks, one deadline for all: `timeout` from the start (each op's own)
    per_op = None if wait_all_ranks else limit_s
    arrived = {r: _p2p(pg, "recv", r, ARRIVE_TAG, per_op) for r in range(1, pg.size())}
    _wait_all(arrived, limit_s, ms, wait_all_ranks)
    answers = {r: _p2p(pg, "send", r, ANSWER_TAG, per_op) for r in range(1, pg.size())}
    _wait_all(answers, limit_s, ms, wait_all_ranks)
