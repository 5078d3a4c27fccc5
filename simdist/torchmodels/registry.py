"""Joinable kinds a scenario's `[[joinables]]` may name, and how users add their own.

A custom joinable subclasses `simdist.torchmodels.join.Joinable`, takes
`(dist, name, group)`, implements `call(num_allreduces)` (a generator: what one
`joinable_call` step does, starting with `yield from Join.notify_join_context(self)`),
`join_hook(**kwargs)` returning a `JoinHook` whose `main_hook`/`post_hook` are generators,
and optionally `observed() -> dict`. Register it before loading the scenario:

    from simdist.torchmodels.registry import register_joinable
    register_joinable("my_kind", MyJoinable)
"""

from __future__ import annotations

from simdist.torchmodels.join import Joinable
from simdist.torchmodels.joinables import AllReducer, Counter

JOINABLE_KINDS: dict[str, type[Joinable]] = {"counter": Counter, "allreducer": AllReducer}


def register_joinable(kind: str, cls: type[Joinable]) -> None:
    if kind in ("ddp", "zero"):
        raise ValueError(f"'{kind}' is reserved")
    JOINABLE_KINDS[kind] = cls
