"""Model of `torch/distributed/optim/zero_redundancy_optimizer.py` (default options:
`overlap_with_ddp=False`, `parameters_as_bucket_view=False`).

`step()` = `_local_step` (which calls `Join.notify_join_context(self)`: a heartbeat only
when ZeRO is the *first* joinable) + `_sync_params`: for every rank r, one async broadcast
from r per parameter of r's shard, all waited together. The shard partition is torch's
greedy one: parameters sorted by size (largest first, stable), each given to the rank
with the smallest total so far (lowest rank on ties).
"""

from __future__ import annotations

from collections.abc import Generator
from typing import Any

from simdist.engine.values import Payload
from simdist.torchmodels.dist import Dist
from simdist.torchmodels.join import Join, Joinable, JoinHook
from simdist.vocab import WORLD


def partition_parameters(numels: list[int], world_size: int) -> list[list[int]]:
    """`ZeroRedundancyOptimizer._partition_parameters` for one param group: indices per rank."""
    per_rank: list[list[int]] = [[] for _ in range(world_size)]
    sizes = [0] * world_size
    for i in sorted(range(len(numels)), key=lambda k: numels[k], reverse=True):
        r = min(range(world_size), key=lambda k: (sizes[k], k))
        per_rank[r].append(i)
        sizes[r] += numels[i]
    return per_rank


class ZeroModel(Joinable):
    """`ZeroRedundancyOptimizer(params, process_group=group)` over parameters of `numels`
    elements and `dtypes`: sharded over the group's ranks, rank k's shard broadcast from
    the group's k-th rank (`get_global_rank(group, k)`, as torch does)."""

    def __init__(self, dist: Dist, numels: list[int], dtypes: list[str], group: str = WORLD):
        super().__init__()
        self.dist = dist
        self.numels = list(numels)
        self.dtypes = list(dtypes)
        self.group = group
        self.members = dist.members(group)
        self.partition = partition_parameters(self.numels, len(self.members))

    @property
    def join_dist(self) -> Dist:
        return self.dist

    @property
    def join_process_group(self) -> str:
        return self.group

    def step(self, origin: str = "zero.step.broadcast_shard") -> Generator[Any, Any, None]:
        yield from Join.notify_join_context(self)  # the returned work is not waited
        works = [
            self.dist.issue("broadcast", Payload.unknown(self.numels[i], self.dtypes[i]), origin=origin,
                            root=self.members[r], group=self.group, async_op=True)
            for r in range(len(self.members))
            for i in self.partition[r]
        ]
        for w in works:
            yield from w.wait()

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _ZeROJoinHook(self)


class _ZeROJoinHook(JoinHook):
    def __init__(self, zero: ZeroModel):
        self.zero = zero

    def main_hook(self) -> Generator[Any, Any, None]:
        yield from self.zero.step(origin="zero.join_hook.broadcast_shard")
