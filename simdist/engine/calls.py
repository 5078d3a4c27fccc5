"""One rank's part in an operation, as the engine holds it.

Its own module because both the matching core (`core`) and the bridge to the backend's
pairing rules (`gloo_bridge`) read it, and neither should import the other for it.
"""

from __future__ import annotations

from dataclasses import dataclass

import simpy

from simdist.engine.values import Payload
from simdist.report import TraceEntry


@dataclass(slots=True)
class Call:
    """One rank's part in a collective or p2p op."""

    rank: int
    op: str
    payload: Payload
    reduce_op: str | None
    root: int | None
    entry: TraceEntry
    event: simpy.Event
