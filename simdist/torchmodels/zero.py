"""Model of `torch/distributed/optim/zero_redundancy_optimizer.py` (default options:
`overlap_with_ddp=False`, `parameters_as_bucket_view=False`).

`step()` = `_local_step` (which calls `Join.notify_join_context(self)`: a heartbeat only
when ZeRO is the *first* joinable) + `_sync_params`: for every rank r, one async broadcast
from r per parameter of r's shard, all waited together. The shard partition is torch's
greedy one: parameters sorted by size (largest first, stable), each given to the rank
with the smallest total so far (lowest rank on ties).
"""

from __future__ import annotations

import heapq
from collections.abc import Generator
from functools import lru_cache
from typing import Any

from simdist.engine.calls import wait_all
from simdist.engine.values import Payload
from simdist.torchmodels.dist import Dist
from simdist.torchmodels.join import Join, Joinable, JoinHook
from simdist.vocab import WORLD


def partition_parameters(numels: list[int], world_size: int) -> list[list[int]]:
    """`ZeroRedundancyOptimizer._partition_parameters` for one param group: indices per rank.

    torch gives each parameter to the rank with the smallest total so far (lowest rank on
    ties): a heap of (total, rank) pops exactly that rank, in log p instead of p."""
    per_rank: list[list[int]] = [[] for _ in range(world_size)]
    totals = [(0, r) for r in range(world_size)]  # sorted, so already a heap
    for i in sorted(range(len(numels)), key=lambda k: numels[k], reverse=True):
        size, r = heapq.heappop(totals)
        per_rank[r].append(i)
        heapq.heappush(totals, (size + numels[i], r))
    return per_rank


@lru_cache(maxsize=64)
def shard_broadcasts(numels: tuple[int, ...], world_size: int) -> tuple[tuple[int, int], ...]:
    """(root, parameter index) of every broadcast of `_sync_params`, in issue order. The
    same on every rank: worked out once per run, not once per rank and step (with 3
    parameters and 1,024 ranks, 1,021 ranks own nothing and issue nothing of their own)."""
    parts = partition_parameters(list(numels), world_size)
    return tuple((r, i) for r in range(world_size) for i in parts[r])


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
        # what `step` broadcasts, in issue order: (global root, payload), made once (payloads are never mutated)
        self.broadcasts = [(self.members[r], Payload.unknown(self.numels[i], self.dtypes[i]))
                           for r, i in shard_broadcasts(tuple(self.numels), len(self.members))]

    @property
    def join_dist(self) -> Dist:
        return self.dist

    @property
    def join_process_group(self) -> str:
        return self.group

    def step(self, origin: str = "zero.step.broadcast_shard") -> Generator[Any, Any, None]:
        if self._join_config.is_first_joinable:  # (else it returns at once: no generator for it)
            yield from Join.notify_join_context(self)  # the returned work is not waited
        issue, group = self.dist.issue, self.group
        yield from wait_all([issue("broadcast", payload, origin=origin, root=root, group=group, async_op=True)
                             for root, payload in self.broadcasts])

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _ZeROJoinHook(self)


class _ZeROJoinHook(JoinHook):
    def __init__(self, zero: ZeroModel):
        self.zero = zero

    def main_hook(self) -> Generator[Any, Any, None]:
        yield from self.zero.step(origin="zero.join_hook.broadcast_shard")
