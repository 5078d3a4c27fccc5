"""A per-rank stand-in for `torch.distributed`: what the models call to communicate."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from simdist.engine.calls import Work
from simdist.engine.core import Engine, RankRaised
from simdist.engine.values import Payload
from simdist.report import Span
from simdist.vocab import WORLD, reduce_op_of


class Dist:
    """`torch.distributed` as seen from one simulated rank."""

    def __init__(self, engine: Engine, rank: int):
        self.engine = engine
        self.rank = rank
        self.warnings: list[str] = []  # what the rank's process shows, in order
        self.compute_spans: list[Span] = []  # the rank's compute, for reports and traces

    def warn(self, text: str) -> None:
        """`warnings.warn` in the modelled torch code, as the rank's process shows it: each
        text once (Python's default filter shows a warning once per code location, and
        torch's Join sets the filter to "once")."""
        if text not in self.warnings:
            self.warnings.append(text)

    @property
    def world_size(self) -> int:
        return self.engine.world_size

    def members(self, group: str) -> list[int]:
        """The global ranks of `group`, sorted (`dist.new_group` sorts them): group rank k is
        `members(group)[k]`, as `dist.get_global_rank(group, k)` says."""
        return self.engine.groups[group]

    def issue(
        self,
        op: str,
        t: Payload,
        *,
        origin: str,
        group: str = "WORLD",
        reduce_op: str | None = None,
        root: int | None = None,
        async_op: bool = False,
    ) -> Work:
        if root is not None and group == WORLD and not 0 <= root < self.engine.world_size and self.engine.backend == "gloo":
            # ProcessGroupGloo checks the root before it enqueues anything (e.g. the tutorial
            # Counter's broadcast from find_common_rank's -1 when no rank was the last joiner)
            raise RankRaised("RuntimeError", f"ProcessGroupGloo::{op}: invalid root rank: {root}")
        reduce_op = reduce_op_of(op, reduce_op)
        return self.engine.issue(
            self.rank, op, t, group=group, origin=origin, reduce_op=reduce_op, root=root, async_op=async_op
        )

    def run(self, op: str, t: Payload, **kw: Any) -> Generator[Any, Any, Payload]:
        """Issue synchronously: returns the result once the collective completes."""
        work = self.issue(op, t, **kw)
        return (yield from work.wait())

    # (`run`'s body written out: one generator less on every wait of Join's count all-reduce)
    def all_reduce(self, t: Payload, *, origin: str, op: str = "sum", group: str = "WORLD") -> Generator[Any, Any, Payload]:
        return (yield from self.issue("all_reduce", t, origin=origin, reduce_op=op, group=group).wait())

    def broadcast(self, t: Payload, src: int, *, origin: str, group: str = "WORLD") -> Generator[Any, Any, Payload]:
        return (yield from self.issue("broadcast", t, origin=origin, root=src, group=group).wait())

    def compute(self, seconds: float) -> Generator[Any, Any, None]:
        if seconds > 0:
            begin = self.engine.env.now
            yield self.engine.env.timeout(seconds)
            self.compute_spans.append(Span(begin, self.engine.env.now))
