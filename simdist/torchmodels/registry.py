"""The joinable kinds a scenario's `[[joinables]]` may name: one registry for both sides.

Each kind names its simulator implementation (a `ScenarioJoinable` subclass) and says
whether the real backend implements it too. Real implementations live in
real_backend/joinables.py, where they register themselves by kind name; simdist never
imports real_backend, so a test checks that the kinds marked `real` here are exactly
those. A scenario naming a kind the chosen side lacks is rejected when it is loaded
(`simdist.scenario.load_scenario(path, target="real")`).

Users add simulator-only kinds from Python before loading the scenario:

    from simdist.torchmodels.registry import register_joinable
    register_joinable("my_kind", MyJoinable)   # MyJoinable(ScenarioJoinable)
"""

from __future__ import annotations

from dataclasses import dataclass

from simdist.torchmodels.joinables import AllReducer, Counter, ScenarioJoinable
from simdist.vocab import MODEL_JOINABLES


@dataclass(frozen=True)
class JoinableKind:
    """A `[[joinables]]` kind: its simulator class and whether a real one exists."""

    name: str
    sim: type[ScenarioJoinable]
    real: bool = False


JOINABLE_KINDS: dict[str, JoinableKind] = {
    k.name: k for k in (JoinableKind("counter", Counter, real=True), JoinableKind("allreducer", AllReducer, real=True))
}


def register_joinable(kind: str, cls: type[ScenarioJoinable]) -> None:
    """Add (or replace) a simulator-only joinable kind, so scenarios can name it in [[joinables]].

    `cls` subclasses `ScenarioJoinable`: what one `joinable_call` step does, and the join
    hook that shadows it on a joined rank. Kinds added here have no real-backend
    implementation, so `simdist real` and `compare` reject scenarios that use them.
    """
    if kind in MODEL_JOINABLES:
        raise ValueError(f"'{kind}' is reserved")
    if not (isinstance(cls, type) and issubclass(cls, ScenarioJoinable)):
        raise TypeError(f"a joinable kind must subclass ScenarioJoinable, not {cls!r}")
    JOINABLE_KINDS[kind] = JoinableKind(kind, cls)


def kinds_for(target: str) -> list[str]:
    """The kinds that `target` ("sim" or "real") implements, sorted."""
    return sorted(k for k, v in JOINABLE_KINDS.items() if target == "sim" or v.real)
