"""Calibrated timing: what the cost model reads when a profile is given.

A `Profile` holds, per (op, world size), the time model fitted to measurements of the
real backend: a piecewise-affine curve in the per-rank size (`PiecewiseFit`, the one the
cost model predicts with) and, for comparison, every algorithm's closed form with fitted
alpha and beta (`AlgoFit`). The fitting itself lives in `simdist.timing.fit`; these are
the results, kept here beside `CostModel` so that the cost model depends on what it
reads and not on how it was made.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simdist.collectives.algorithms import REGISTRY


@dataclass
class Segment:
    lo: float  # applies to lo <= n < hi
    hi: float
    a: float  # seconds
    b: float  # seconds per byte

    def __call__(self, n: float) -> float:
        return self.a + self.b * n


@dataclass
class PiecewiseFit:
    segments: list[Segment]
    sse: float = 0.0

    def predict(self, n: float) -> float:
        for s in self.segments:
            if n < s.hi:
                return s(n)
        return self.segments[-1](n)

    @property
    def breakpoints(self) -> list[float]:
        return [s.lo for s in self.segments[1:]]

    def to_dict(self) -> dict:
        return {"segments": [asdict(s) for s in self.segments], "sse": self.sse}

    @classmethod
    def from_dict(cls, d: dict) -> PiecewiseFit:
        return cls([Segment(**s) for s in d["segments"]], d.get("sse", 0.0))


@dataclass
class AlgoFit:
    """One algorithm's closed form with alpha and beta fitted to a sweep (gamma measured)."""

    algo: str
    alpha: float
    beta: float
    gamma: float
    sse: float

    def predict(self, op: str, nbytes: float, p: int) -> float:
        return REGISTRY[(op, self.algo)].time(p, nbytes, self.alpha, self.beta, self.gamma)


@dataclass
class OpProfile:
    op: str
    world_size: int
    piecewise: PiecewiseFit
    algos: dict[str, AlgoFit] = field(default_factory=dict)
    backend: str = "gloo"

    def to_dict(self) -> dict:
        return {
            "op": self.op,
            "world_size": self.world_size,
            "backend": self.backend,
            "piecewise": self.piecewise.to_dict(),
            "algos": {k: asdict(v) for k, v in self.algos.items()},
        }

    @classmethod
    def from_dict(cls, d: dict) -> OpProfile:
        return cls(
            d["op"],
            int(d["world_size"]),
            PiecewiseFit.from_dict(d["piecewise"]),
            {k: AlgoFit(**v) for k, v in d.get("algos", {}).items()},
            d.get("backend", "gloo"),
        )


@dataclass
class Profile:
    """Calibrated timing per (op, world size); `predict` returns None where not calibrated."""

    entries: dict[tuple[str, int], OpProfile] = field(default_factory=dict)

    def add(self, e: OpProfile) -> None:
        self.entries[(e.op, e.world_size)] = e

    def predict(self, op: str, nbytes: float, p: int) -> float | None:
        e = self.entries.get((op, p))
        if e is None:
            return None
        return e.piecewise.predict(nbytes)

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps({"entries": [e.to_dict() for e in self.entries.values()]}, indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        d = json.loads(Path(path).read_text())
        prof = cls()
        for e in d["entries"]:
            prof.add(OpProfile.from_dict(e))
        return prof
