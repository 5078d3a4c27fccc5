"""A per-rank stand-in for `torch.distributed`: what the models call to communicate."""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from simdist.engine.core import Engine, Work
from simdist.engine.values import Payload
from simdist.vocab import reduce_op_of


class Dist:
    """`torch.distributed` as seen from one simulated rank."""

    def __init__(self, engine: Engine, rank: int):
        self.engine = engine
        self.rank = rank

    @property
    def world_size(self) -> int:
        return self.engine.world_size

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
        reduce_op = reduce_op_of(op, reduce_op)
        return self.engine.issue(
            self.rank, op, t, group=group, origin=origin, reduce_op=reduce_op, root=root, async_op=async_op
        )

    def run(self, op: str, t: Payload, **kw: Any) -> Generator[Any, Any, Payload]:
        """Issue synchronously: returns the result once the collective completes."""
        work = self.issue(op, t, **kw)
        return (yield from work.wait())

    def all_reduce(self, t: Payload, *, origin: str, op: str = "sum", group: str = "WORLD") -> Generator[Any, Any, Payload]:
        return (yield from self.run("all_reduce", t, origin=origin, reduce_op=op, group=group))

    def broadcast(self, t: Payload, src: int, *, origin: str, group: str = "WORLD") -> Generator[Any, Any, Payload]:
        return (yield from self.run("broadcast", t, origin=origin, root=src, group=group))

    def compute(self, seconds: float) -> Generator[Any, Any, None]:
        if seconds > 0:
            yield self.engine.env.timeout(seconds)
