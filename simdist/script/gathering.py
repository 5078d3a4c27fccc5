"""Who waits for whom while ranks gather (a world in `init_process_group`, a group's members in
`new_group`): the one wording of the status lines both sides print and of init's early verdict.

A rank waits in either call, on real Gloo at the c10d store, until every rank it needs has
come; a long wait is said in status lines (`initwatch`) that read the same on the simulated
side and the real one: each wait (the call, the user's line) and its ranks, what they wait
for, which ranks never came, and what real torch does with the waits and when.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass


@dataclass
class Gathering:
    """Ranks waiting for the others: `waits` (rank -> the wait's words, its user's `file:line`,
    since when: wall time), what they wait for (`whole`: "a world of 3", "the group of ranks
    [0, 1]"), the ranks that never came, and what real torch does with the waits (`torch`)."""

    waits: dict[int, tuple[str, str, float]]
    whole: str
    missing: list[int]
    torch: str = ""

    def since(self) -> tuple[float, float]:
        """When the first and the last of the waits began."""
        times = [s for _w, _a, s in self.waits.values()]
        return min(times), max(times)

    def words(self) -> str:
        """Each wait and its ranks, what they wait for, and which ranks never came."""
        by: dict[str, list[int]] = {}
        for rank, (words, at, _since) in sorted(self.waits.items()):
            by.setdefault(f"{words} at {at}", []).append(rank)
        said = "; ".join(f"rank(s) {ranks} {wait}" for wait, ranks in by.items())
        return f"{said} for {self.whole}; rank(s) {self.missing} never came"


def group_words(members: list[int]) -> str:
    """What ranks wait for in a group's creation (or a store-based barrier), in a status line."""
    return f"the group of ranks {members}"


def span(seconds: float) -> str:
    """A timeout in words: minutes from one minute on (torch's defaults: 30 min, 10 min), else seconds."""
    return f"{seconds / 60:g} min" if seconds >= 60 else f"{seconds:g} s"


def timeouts_words(limits: Iterable[float | None]) -> str:
    """Real Gloo: when torch ends the waits, from the timeouts the ranks' stalls name (`rank.stall`)."""
    known = [t for t in limits if t is not None]
    return f"torch ends these waits after {span(min(known))} (their timeout)" if known else \
        "torch's waits have no timeout"


def raises_words(errors: Iterable[tuple[int, tuple[str, str]]], after_s: float) -> str:
    """The simulated side: what real torch raises on each rank ((rank, (type, message)) each)
    once the waits' timeout, `after_s`, runs out (init's and a group's waits alike)."""
    said = "; ".join(f"rank {r}: {kind}: {message}" for r, (kind, message) in sorted(errors))
    return f"real torch: {said} after {span(after_s)}" if said else "real torch: waits for good"
