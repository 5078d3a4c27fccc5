"""The `[[joinables]]` extension point and the two kinds simdist bundles, modelled call for
call: the Join tutorial's `Counter` and torch's test `AllReducer`
(test/distributed/algorithms/test_join.py). Their real counterparts are in
real_backend/joinables.py; `torchmodels.registry` names both.

Both communicate on their own process group (`group`, WORLD by default): the originals
use the default group for their per-call all-reduces and broadcasts, which is the same
group for a joinable on WORLD; on a named group, only that group's ranks build one, so its
collectives go to that group, and the ranks `find_common_rank` votes on are ranks of the
group (a broadcast's source becomes a global rank with `dist.get_global_rank`).
"""

from __future__ import annotations

from abc import abstractmethod
from collections.abc import Generator
from typing import Any

from simdist.engine.core import RankRaised
from simdist.engine.values import Payload
from simdist.torchmodels.dist import Dist
from simdist.torchmodels.join import Join, Joinable, JoinHook
from simdist.vocab import NO_COMMON_RANK, WORLD

BEFORE_CONSTANT = 41
AFTER_CONSTANT = 42


class ScenarioJoinable(Joinable):
    """What a `[[joinables]]` kind implements in the simulator (register it with
    `torchmodels.registry.register_joinable`).

    Built as `cls(dist, name, group)`. Besides torch's `Joinable` (`join_hook`), a kind
    says what one `joinable_call` step does (`call`, a generator that starts with
    `yield from Join.notify_join_context(self)`, as torch's joinables do) and, optionally,
    which values it reports (`observed`).
    """

    def __init__(self, dist: Dist, name: str, group: str = WORLD):
        super().__init__()
        self.dist = dist
        self.name = name
        self.group = group

    @property
    def join_dist(self) -> Dist:
        return self.dist

    @property
    def join_process_group(self) -> str:
        return self.group

    @abstractmethod
    def call(self, num_allreduces: int) -> Generator[Any, Any, None]:
        """One `joinable_call` step (`num_allreduces` is resolved by the interpreter)."""

    def observed(self) -> dict[str, Any]:
        """Values for the rank's report, keyed `<name>.<value>`."""
        return {}

    def _max_rank(self, to_consider: bool, origin: str) -> Generator[Any, Any, int]:
        """The all-reduce MAX of `find_common_rank`: this rank of the group, or -1 when not to consider."""
        rank = self.dist.members(self.group).index(self.dist.rank)
        res = yield from self.dist.all_reduce(Payload.full(1, "int64", rank if to_consider else -1), origin=origin,
                                              op="max", group=self.group)
        return int(res.item() or 0)

    def all_reduce(self, value: float, origin: str) -> Generator[Any, Any, Payload]:
        """`dist.all_reduce(torch.full((1,), value), group=self.process_group)`."""
        return (yield from self.dist.all_reduce(Payload.full(1, "float32", value), origin=origin, group=self.group))

    def broadcast(self, t: Payload, group_src: int, origin: str) -> Generator[Any, Any, Payload]:
        """`dist.broadcast(t, src=get_global_rank(group, group_src), group=group)`. On WORLD the
        group rank is the global one, also out of range (the tutorial Counter's -1, which Gloo
        rejects); on another group `get_global_rank` raises for a rank the group lacks."""
        members = self.dist.members(self.group)
        if self.group == WORLD:
            src = group_src
        elif 0 <= group_src < len(members):
            src = members[group_src]
        else:
            raise RankRaised("ValueError", f"Group rank {group_src} is not part of group {self.group}")
        return (yield from self.dist.broadcast(t, src, origin=origin, group=self.group))


class Counter(ScenarioJoinable):
    """Counts inputs across ranks: `count` sums an all-reduce of ones per call."""

    def __init__(self, dist: Dist, name: str, group: str = WORLD):
        super().__init__(dist, name, group)
        self.count = 0.0
        self.max_count = 0.0

    def call(self, num_allreduces: int = 1) -> Generator[Any, Any, None]:
        yield from Join.notify_join_context(self)
        t = yield from self.all_reduce(1.0, "counter.call.allreduce")
        self.count += t.item() or 0.0

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _CounterJoinHook(self, bool(kwargs.get("sync_max_count", False)))

    def find_common_rank(self, to_consider: bool) -> Generator[Any, Any, int]:
        """The tutorial's: the max rank to consider (-1 when none is, and nothing checks it)."""
        return (yield from self._max_rank(to_consider, "counter.post_hook.find_common_rank"))

    def observed(self) -> dict[str, Any]:
        return {f"{self.name}.count": self.count, f"{self.name}.max_count": self.max_count}


class _CounterJoinHook(JoinHook):
    def __init__(self, counter: Counter, sync_max_count: bool):
        self.counter = counter
        self.sync_max_count = sync_max_count

    def main_hook(self) -> Generator[Any, Any, None]:
        yield from self.counter.all_reduce(0.0, "counter.main_hook.allreduce")

    def post_hook(self, is_last_joiner: bool) -> Generator[Any, Any, None]:
        if not self.sync_max_count:
            return
        c = self.counter
        common_rank = yield from c.find_common_rank(is_last_joiner)
        if c.dist.members(c.group).index(c.dist.rank) == common_rank:
            c.max_count = c.count
        res = yield from c.broadcast(Payload.full(1, "float32", c.max_count), common_rank,
                                     "counter.post_hook.broadcast_max_count")
        c.max_count = float(res.item() or 0.0)


class AllReducer(ScenarioJoinable):
    """torch's test joinable: `num_allreduces` all-reduces of ones per call; returns their total."""

    def __init__(self, dist: Dist, name: str, group: str = WORLD):
        super().__init__(dist, name, group)
        self.total = 0.0
        self.post_hook_tensor = BEFORE_CONSTANT

    def call(self, num_allreduces: int = 1) -> Generator[Any, Any, None]:
        yield from Join.notify_join_context(self)
        for _ in range(num_allreduces):
            t = yield from self.all_reduce(1.0, "allreducer.call.allreduce")
            self.total += t.item() or 0.0

    def join_hook(self, **kwargs: Any) -> JoinHook:
        return _AllReducerJoinHook(self, int(kwargs.get("num_allreduces", 1)), bool(kwargs.get("run_post_hooks", False)))

    def find_common_rank(self, to_consider: bool) -> Generator[Any, Any, int]:
        """torch's test: the max rank to consider, asserted to exist (`assert common_rank >= 0`)."""
        common_rank = yield from self._max_rank(to_consider, "allreducer.post_hook.find_common_rank")
        if common_rank < 0:
            raise RankRaised("AssertionError", NO_COMMON_RANK)
        return common_rank

    def observed(self) -> dict[str, Any]:
        return {f"{self.name}.total": self.total, f"{self.name}.post_hook_tensor": self.post_hook_tensor}


class _AllReducerJoinHook(JoinHook):
    def __init__(self, allreducer: AllReducer, num_allreduces: int, run_post_hook: bool):
        self.allreducer = allreducer
        self.num_allreduces = num_allreduces
        self.run_post_hook = run_post_hook

    def main_hook(self) -> Generator[Any, Any, None]:
        for _ in range(self.num_allreduces):
            yield from self.allreducer.all_reduce(0.0, "allreducer.main_hook.allreduce")

    def post_hook(self, is_last_joiner: bool) -> Generator[Any, Any, None]:
        if not self.run_post_hook:
            return
        a = self.allreducer
        common_rank = yield from a.find_common_rank(is_last_joiner)
        if a.dist.members(a.group).index(a.dist.rank) == common_rank:
            a.post_hook_tensor = AFTER_CONSTANT
        res = yield from a.broadcast(Payload.full(1, "int64", a.post_hook_tensor), common_rank,
                                     "allreducer.post_hook.broadcast")
        a.post_hook_tensor = int(res.item() or 0)
