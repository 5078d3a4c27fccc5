"""Calibrated timing: what the cost model reads when a profile is given.

A `Profile` holds, per (op, world size), the time model fitted to measurements of the
real backend: a piecewise-affine curve in the per-rank size (`PiecewiseFit`, the one the
cost model predicts with) and, for comparison, every algorithm's closed form with fitted
alpha and beta (`AlgoFit`). The fitting itself lives in `simdist.timing.fit`; these are
the results, kept here beside `CostModel` so that the cost model depends on what it
reads and not on how it was made.
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simdist.collectives.algorithms import REGISTRY
from simdist.errors import ScenarioError
from simdist.jsonout import dumps
from simdist.network.gloo_time import GLOO_TIMED_OPS, gloo_op_time
from simdist.network.host import HostProfile
from simdist.userfiles import read_json


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
        """JSON-ready: the last segment's open end (hi = inf) is written as null, since
        JSON has no infinity (older files wrote ``Infinity``, which `load_profile` still reads)."""
        return {"segments": [{**asdict(s), "hi": None if math.isinf(s.hi) else s.hi} for s in self.segments],
                "sse": self.sse}

    @classmethod
    def from_dict(cls, d: dict) -> PiecewiseFit:
        return cls([Segment(**{**s, "hi": math.inf if s.get("hi") is None else s["hi"]}) for s in d["segments"]],
                   d.get("sse", 0.0))


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
    host: HostProfile | None = None  # measured primitives: predicts what `entries` lacks

    def add(self, e: OpProfile) -> None:
        self.entries[(e.op, e.world_size)] = e

    def predict(self, op: str, nbytes: float, p: int) -> float | None:
        e = self.entries.get((op, p))
        if e is not None:
            return e.piecewise.predict(nbytes)
        if self.host is not None and op in GLOO_TIMED_OPS:
            return gloo_op_time(self.host, op, int(nbytes), p)
        return None

    def save(self, path: str | Path) -> Path:
        path = Path(path)
        path.parent.mkdir(parents=True, exist_ok=True)
        doc: dict = {"entries": [e.to_dict() for e in self.entries.values()]}
        if self.host is not None:
            doc["host"] = self.host.to_dict()
        path.write_text(dumps(doc, indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> Profile:
        """The checked profile at `path` (`load_profile`: a ScenarioError when it is not one)."""
        return load_profile(path)


_LOADED: dict[tuple[str, int, int], Profile] = {}


def load_profile(path: str | Path, field: str = "topology.profile") -> Profile:
    """The calibrated profile at `path`, checked, or a ScenarioError naming `field`: a regular
    file of at most `limits.FILE_BYTES` bytes of strict JSON (`simdist.userfiles`), whose
    entries have the shape `Profile.save` writes and only finite numbers. Cached per
    (path, modification time, size): the fuzzer validates many scenarios naming one profile."""
    p = Path(path)
    try:
        st = p.stat()
        key = (str(p.resolve()), st.st_mtime_ns, st.st_size)
    except (OSError, ValueError):
        key = None
    if key is not None and key in _LOADED:
        return _LOADED[key]
    try:
        doc = read_json(p, "calibrated profile", infinity=None)  # an open end: see PiecewiseFit.to_dict
    except ScenarioError as e:
        raise ScenarioError(f"{field}: {e}") from None
    try:
        prof = Profile()
        for e in doc.get("entries", []):
            prof.add(OpProfile.from_dict(e))
        if doc.get("host") is not None:
            prof.host = HostProfile.from_dict(doc["host"])
        _check(prof)
    except (KeyError, TypeError, ValueError, AttributeError, IndexError) as e:
        raise ScenarioError(f"{field}: {p} is not a calibrated profile ({type(e).__name__}: {e})") from None
    if key is not None:
        _LOADED[key] = prof
    return prof


def _check(prof: Profile) -> None:
    """Numbers where numbers belong and curves that can predict (raises ValueError)."""
    for (op, p), e in prof.entries.items():
        if not isinstance(op, str) or not isinstance(p, int) or isinstance(p, bool) or p < 1:
            raise ValueError(f"entry ({op!r}, {p!r}): op must be a name and world_size an integer >= 1")
        if not e.piecewise.segments:
            raise ValueError(f"{op} on {p} ranks: no segments")
        for s in e.piecewise.segments:
            if not _numbers(s.lo, s.hi, s.a, s.b):
                raise ValueError(f"{op} on {p} ranks: a segment's lo, hi, a and b must be numbers")
        for name, fit in e.algos.items():
            if (op, fit.algo) not in REGISTRY:
                raise ValueError(f"{op} on {p} ranks: unknown algorithm {name!r}")
            if not _numbers(fit.alpha, fit.beta, fit.gamma, fit.sse) or math.isinf(fit.sse):
                raise ValueError(f"{op} on {p} ranks, {name}: alpha, beta, gamma and sse must be finite numbers")


def _numbers(*xs: object) -> bool:
    return all(isinstance(x, (int, float)) and not isinstance(x, bool) for x in xs)
