"""The two custom joinables that scenarios may use, as real `torch.distributed` Joinables.

* `Counter` / `CounterJoinHook`: the PyTorch "Distributed Training with Uneven Inputs Using
  the Join Context Manager" tutorial (generic_join), unchanged in what it communicates.
* `AllReducer` / `AllReducerJoinHook`: torch's own test joinable from
  test/distributed/algorithms/test_join.py, unchanged in what it communicates.

Each registers itself in `REAL_JOINABLES` under its scenario kind; the simulator's
registry (`simdist.torchmodels.registry`) marks the same kinds as having a real
implementation (a test checks that the two agree).

One change, which only matters off WORLD: every collective goes to the joinable's own
process group, and a post hook's broadcast names its source as a global rank
(`_global`). The originals use the default group and a group rank there, which is the same
thing on WORLD; on a named group a joinable is built only on that group's ranks (as the
simulator's, `simdist.torchmodels.joinables`), so the originals' calls could not match.

The only additions besides are bookkeeping that issues no collective: the common rank each
`find_common_rank` returned (`last_common_rank`, so the recorder can name broadcast roots),
`AllReducer.total_sum` (the sum of every `__call__`'s return value, observed as
`<name>.total`), and what the worker calls (`ScenarioJoinable.call`, `observed`). The
recorder identifies these methods by their qualified names (file and line of the Flight
Recorder's Python frames), so keep them as methods of these classes.
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Callable
from typing import Any, TypeVar

import torch
import torch.distributed as dist
from torch.distributed.algorithms.join import Join, Joinable, JoinHook

from simdist.vocab import NO_COMMON_RANK

# Constants of torch's test_join.py (post-hook test values).
BEFORE_CONSTANT = 41
AFTER_CONSTANT = 42


class ScenarioJoinable(Joinable):
    """What the worker needs of a `[[joinables]]` kind besides torch's `Joinable`: one
    `joinable_call` step (`call`) and the values it reports (`observed`). Built as
    `cls(device, process_group)`, as torch's test joinables are."""

    def __init__(self, device: torch.device, process_group: Any):
        super().__init__()
        self.device = device
        self.process_group = process_group
        self.last_common_rank: int | None = None

    @property
    def join_device(self) -> torch.device:
        return self.device

    @property
    def join_process_group(self) -> Any:
        return self.process_group

    def _global(self, group_rank: int) -> int:
        """`dist.get_global_rank` of a rank of this joinable's group (WORLD: the rank itself,
        also -1; another group raises ValueError for a rank it lacks, as torch does)."""
        if self.process_group is dist.group.WORLD:
            return group_rank
        return dist.get_global_rank(self.process_group, group_rank)

    @abstractmethod
    def call(self, num_allreduces: int) -> None:
        """One `joinable_call` step."""

    @abstractmethod
    def observed(self, name: str) -> dict[str, float]:
        """Values for the rank's report, keyed `<name>.<value>` as the simulator's."""


REAL_JOINABLES: dict[str, type[ScenarioJoinable]] = {}
_J = TypeVar("_J", bound=type[ScenarioJoinable])


def real_joinable(kind: str) -> Callable[[_J], _J]:
    """Class decorator: the real implementation of scenario joinable kind `kind`."""

    def register(cls: _J) -> _J:
        REAL_JOINABLES[kind] = cls
        return cls

    return register


class CounterJoinHook(JoinHook):
    """Join hook for `Counter` (tutorial): shadows the all-reduce; optional max-count sync."""

    def __init__(self, counter: Counter, sync_max_count: bool):
        self.counter = counter
        self.sync_max_count = sync_max_count

    def main_hook(self) -> None:
        """Shadows the counter's all-reduce by all-reducing a dim-1 zero tensor."""
        t = torch.zeros(1, device=self.counter.device)
        dist.all_reduce(t, group=self.counter.process_group)

    def post_hook(self, is_last_joiner: bool) -> None:
        """Synchronizes the max count across all counters if ``sync_max_count=True``."""
        if not self.sync_max_count:
            return
        rank = dist.get_rank(self.counter.process_group)
        common_rank = self.counter.find_common_rank(rank, is_last_joiner)
        if rank == common_rank:
            self.counter.max_count = self.counter.count.detach().clone()
        dist.broadcast(self.counter.max_count, src=self.counter._global(common_rank), group=self.counter.process_group)


@real_joinable("counter")
class Counter(ScenarioJoinable):
    """Tutorial joinable that counts the inputs processed by all ranks before it joins."""

    def __init__(self, device: torch.device, process_group: Any):
        super().__init__(device, process_group)
        self.count = torch.tensor([0], device=device).float()
        self.max_count = torch.tensor([0], device=device).float()

    def __call__(self) -> None:
        """Counts this iteration's inputs over all ranks with an all-reduce of ones."""
        Join.notify_join_context(self)
        t = torch.ones(1, device=self.device).float()
        dist.all_reduce(t, group=self.process_group)
        self.count += t

    def join_hook(self, **kwargs: Any) -> JoinHook:
        """Hook shadowing `__call__`; kwarg ``sync_max_count`` (default False)."""
        sync_max_count = kwargs.get("sync_max_count", False)
        return CounterJoinHook(self, sync_max_count)

    def call(self, num_allreduces: int) -> None:
        self()

    def observed(self, name: str) -> dict[str, float]:
        return {f"{name}.count": float(self.count.item()), f"{name}.max_count": float(self.max_count.item())}

    def find_common_rank(self, rank: int, to_consider: bool) -> int:
        """Returns the max rank of the ones to consider over the process group."""
        common_rank = torch.tensor([rank if to_consider else -1], device=self.device)
        dist.all_reduce(common_rank, op=dist.ReduceOp.MAX, group=self.process_group)
        common_rank = common_rank.item()
        self.last_common_rank = int(common_rank) if common_rank < 0 else self._global(int(common_rank))
        return common_rank


class AllReducerJoinHook(JoinHook):
    """Join hook for `AllReducer` (torch test): shadows `num_allreduces` all-reduces per
    iteration; with ``run_post_hooks`` broadcasts AFTER_CONSTANT from the last joiner."""

    def __init__(self, allreducer: AllReducer, num_allreduces: int, run_post_hook: bool):
        self.allreducer = allreducer
        self.num_allreduces = num_allreduces
        self.run_post_hook = run_post_hook

    def main_hook(self) -> None:
        device = self.allreducer.device
        for _ in range(self.num_allreduces):
            t = torch.zeros(1, device=device)
            dist.all_reduce(t, group=self.allreducer.process_group)

    def post_hook(self, is_last_joiner: bool) -> None:
        if not self.run_post_hook:
            return
        rank = dist.get_rank(self.allreducer.process_group)
        common_rank = self.allreducer.find_common_rank(rank, is_last_joiner)
        device = self.allreducer.device
        if rank == common_rank:
            self.allreducer.post_hook_tensor = torch.tensor([AFTER_CONSTANT], device=device)
        dist.broadcast(self.allreducer.post_hook_tensor, src=self.allreducer._global(common_rank),
                       group=self.allreducer.process_group)


@real_joinable("allreducer")
class AllReducer(ScenarioJoinable):
    """torch test joinable: `__call__(n)` all-reduces a dim-1 ones tensor n times and
    returns the total."""

    def __init__(self, device: torch.device, process_group: Any):
        super().__init__(device, process_group)
        self.post_hook_tensor = torch.tensor([BEFORE_CONSTANT], device=self.device)
        self.total_sum = 0.0

    def __call__(self, num_allreduces: int = 1) -> float:
        Join.notify_join_context(self)
        device = self.device
        total = 0
        for _ in range(num_allreduces):
            t = torch.ones(1, device=device)
            dist.all_reduce(t, group=self.process_group)
            total += t.item()
        self.total_sum += total
        return total

    def join_hook(self, **kwargs: Any) -> JoinHook:
        num_allreduces = kwargs.get("num_allreduces", 1)
        run_post_hook = kwargs.get("run_post_hooks", False)
        return AllReducerJoinHook(self, num_allreduces, run_post_hook)

    def call(self, num_allreduces: int) -> None:
        self(num_allreduces)

    def observed(self, name: str) -> dict[str, float]:
        return {f"{name}.total": float(self.total_sum), f"{name}.post_hook_tensor": float(self.post_hook_tensor.item())}

    def find_common_rank(self, rank: int, to_consider: bool) -> int:
        common_rank = torch.tensor([rank if to_consider else -1], device=self.device)
        dist.all_reduce(common_rank, op=dist.ReduceOp.MAX, group=self.process_group)
        common_rank = common_rank.item()
        if common_rank < 0:  # torch's test: assert common_rank >= 0
            raise AssertionError(NO_COMMON_RANK)
        self.last_common_rank = self._global(int(common_rank))
        return common_rank
