"""Model of `torch/distributed/algorithms/join.py`: Join, Joinable, JoinHook.

Mirrors torch 2.13 line by line where collectives or control flow are concerned:
`notify_join_context` (heartbeat, throw check), `__exit__` (count non-joined, main hooks,
post hooks, `is_last_joiner`, the 1000-pass warning) and the process-group check.
"""

from __future__ import annotations

from abc import ABC, abstractmethod
from collections.abc import Generator
from dataclasses import dataclass
from typing import Any

from simdist.engine.calls import Work
from simdist.engine.core import RankRaised
from simdist.engine.values import Payload
from simdist.torchmodels.dist import Dist

WARN_THRESHOLD = 1000
# The float32 scalars Join and DDP send every iteration (`torch.zeros(1)`, `torch.ones(1)`), made
# once: payloads are never mutated, and making one is a cache lookup per rank-collective.
ZERO_F32 = Payload.full(1, "float32", 0.0)
ONE_F32 = Payload.full(1, "float32", 1.0)


@dataclass(frozen=True)
class JoinConfig:
    """torch's `_JoinConfig`."""

    enable: bool = False
    throw_on_early_termination: bool = False
    is_first_joinable: bool = False


class JoinHook:
    """torch's `JoinHook`: both hooks are generators (they may communicate)."""

    def main_hook(self) -> Generator[Any, Any, None]:
        return
        yield

    def post_hook(self, is_last_joiner: bool) -> Generator[Any, Any, None]:
        return
        yield


class Joinable(ABC):
    """torch's `Joinable(ABC)`: what an object must provide to take part in `Join`.

    `join_hook` returns the hook that shadows the object's collectives on a joined rank;
    `join_dist` is where Join's own collectives go (torch: `join_device`, the device its
    tensors live on; in the model, the rank's `Dist`); `join_process_group` is the group of
    the heartbeat and the count all-reduce. DDP and ZeRO implement it, and so does every
    `[[joinables]]` kind (`torchmodels.joinables.ScenarioJoinable`).
    """

    def __init__(self) -> None:
        self._join_config = JoinConfig()

    @abstractmethod
    def join_hook(self, **kwargs: Any) -> JoinHook:
        """The hook that shadows this object's per-iteration collectives; gets Join's kwargs."""

    @property
    @abstractmethod
    def join_dist(self) -> Dist:
        """The rank's `Dist` that Join's heartbeat and count all-reduces go through."""

    @property
    @abstractmethod
    def join_process_group(self) -> str:
        """Name of the process group of Join's own collectives."""


class Join:
    """torch's `Join` context manager, as a model: `enter()` then `exit(exc)`."""

    def __init__(self, joinables: list[Joinable], enable: bool = True, throw_on_early_termination: bool = False,
                 **kwargs: Any):
        if len(joinables) == 0:
            raise RankRaised("ValueError", "The join context manager requires at least one joinable", "model")
        self._joinables = joinables
        self._join_hooks = [j.join_hook(**kwargs) for j in joinables]
        self._enable = enable
        self._throw_on_early_termination = throw_on_early_termination
        first = True
        for j in joinables:
            j._join_config = JoinConfig(enable, throw_on_early_termination, first)
            first = False
        groups = {j.join_process_group for j in joinables}
        if len(groups) > 1:
            raise RankRaised("ValueError", "Using join context manager with multiple process groups", "model")
        self._process_group = joinables[0].join_process_group
        self.dist = joinables[0].join_dist
        self.rank = self.dist.rank

    def exit(self, exc: BaseException | None) -> Generator[Any, Any, None]:
        """`Join.__exit__`: shadow the non-joined ranks until all have joined, then post hooks."""
        if not self._enable or exc is not None:
            return
        all_procs_joined = False
        is_last_joiner = True
        i = 0
        while not all_procs_joined:
            if i > WARN_THRESHOLD:  # torch sets warnings.simplefilter("once"): shown once
                self.dist.warn(
                    f"Detected uneven input skew of greater than {WARN_THRESHOLD}. This means that rank "
                    f"{self.rank} has at least {WARN_THRESHOLD} fewer inputs than other currently-active ranks. "
                    "This level of skew could lead to performance degradation during training."
                )
            res = yield from self.dist.all_reduce(
                ZERO_F32, origin="join.exit.count_nonjoined", group=self._process_group
            )
            num_nonjoined = res.item()
            if num_nonjoined == 0:
                all_procs_joined = True
            else:
                if self._throw_on_early_termination:
                    yield from self.dist.all_reduce(
                        ONE_F32, origin="join.exit.notify_terminate", group=self._process_group
                    )
                    raise RankRaised("RuntimeError", f"Rank {self.rank} exhausted all inputs.", "join_early_termination")
                for hook in self._join_hooks:
                    yield from hook.main_hook()
                is_last_joiner = False
                i += 1
        for hook in self._join_hooks:
            yield from hook.post_hook(is_last_joiner)

    @staticmethod
    def notify_join_context(joinable: Joinable) -> Generator[Any, Any, Work | None]:
        """`Join.notify_join_context`: heartbeat from the first joinable (and the throw check)."""
        cfg = joinable._join_config
        if not cfg.is_first_joinable or not cfg.enable:
            return None
        d = joinable.join_dist
        group = joinable.join_process_group
        work = d.issue("all_reduce", ONE_F32, origin="join.notify_join_context.heartbeat",
                       group=group, async_op=True)
        if cfg.throw_on_early_termination:
            res = yield from d.all_reduce(ZERO_F32, origin="join.notify_join_context.throw_check",
                                          group=group)
            if res.item():
                raise RankRaised(
                    "RuntimeError",
                    "Detected at least one rank that exhausted inputs. Throwing across all ranks.",
                    "join_early_termination",
                )
        return work
