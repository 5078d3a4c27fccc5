"""What a rank's program knows about itself, for labelling Flight Recorder entries.

`real_backend.torchrank` leaves these marks as it runs (times from `time.time_ns()`, the
same realtime clock as FR's `time_created_ns`, taken on the same thread);
`real_backend.record` reads them to give FR entries their phase, iteration, user-step
label, reduce op and root, and to add the p2p ops Gloo's FR does not record.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass, field


@dataclass
class StepWindow:
    """A user collective step's execution on the program's main thread."""

    t0_ns: int
    t1_ns: int | None
    label: str  # origin label: user.<name> / user.loop[k] / user.after[k]
    op: str
    numel: int
    dtype: str
    reduce_op: str | None
    root: int | None
    async_op: bool
    wait: str = "now"  # now | end_of_iteration | never (async collectives)


@dataclass
class P2PRecord:
    """A send/recv the program issued (Gloo's FR does not record p2p)."""

    t_ns: int
    op: str  # send | recv
    numel: int
    dtype: str
    peer: int
    label: str
    async_op: bool
    seq: int
    t_done_ns: int | None = None
    wait: str = "now"


@dataclass
class Marks:
    """Everything the program marked, for labelling FR entries."""

    t0_ns: int
    phases: list[tuple[int, str, int | None]] = field(default_factory=list)  # (t_ns, phase, iteration)
    steps: list[StepWindow] = field(default_factory=list)
    p2p: list[P2PRecord] = field(default_factory=list)
    pg_names: dict[str, str] = field(default_factory=dict)  # FR pg name -> scenario group name
    group_sizes: dict[str, int] = field(default_factory=dict)
    group_ranks: dict[str, list[int]] = field(default_factory=dict)  # scenario group name -> its global ranks
    post_hook_root: int | None = None  # common rank found by the Join post hooks
    zero_roots: list[int] = field(default_factory=list)  # source rank of each ZeRO broadcast, per step
    join_enabled: bool = False
    waiting_pending: bool = False  # the main thread waits on the iteration's deferred work

    def phase_at(self, t_ns: int) -> tuple[str, int | None]:
        i = bisect.bisect_right([p[0] for p in self.phases], t_ns) - 1
        if i < 0:
            return "init", None
        _, phase, it = self.phases[i]
        return phase, it

    def step_at(self, t_ns: int) -> StepWindow | None:
        i = bisect.bisect_right([s.t0_ns for s in self.steps], t_ns) - 1
        if i < 0:
            return None
        s = self.steps[i]
        return s if s.t1_ns is None or t_ns <= s.t1_ns else None
