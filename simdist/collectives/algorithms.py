"""The registry of collective algorithms: names, closed-form costs and byte counts.

Every algorithm is registered as ``(op, algo) -> Algorithm`` with
  * ``schedule(p, count, root)``: the step-level `Schedule` (any p >= 1), from
    `simdist.collectives.generators`;
  * ``coeffs(p)``: (ca, kb, kg) so that the closed-form time is
    ``T = ca*alpha + n*(kb*beta + kg*gamma)`` (n = per-rank bytes as defined in
    `simdist.network.cost`); closed forms are cached per p by the cost model;
  * ``units(p, count)``: the units the schedule puts on the wire, summed over messages.

The closed forms are the textbook ones (Thakur, Rabenseifner & Gropp 2005; Chan et al.
2007) for powers of two, extended exactly to any p by MPICH's folding (2r ranks pair up
before and after a power-of-two core) or by summing per-step maxima. They equal the
no-contention step-level execution when n divides evenly into the blocks (tests).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import lru_cache

import simdist.collectives.generators as g
from simdist.collectives.schedule import Schedule, ceil_log2, pow2_floor
from simdist.errors import ScenarioError
from simdist.vocab import COLLECTIVE_OPS

Coeffs = tuple[float, float, float]


@dataclass(frozen=True)
class TimeSplit:
    """Where a closed form's time goes: the alpha, beta and gamma terms, in seconds.

    The terms are what a user changes separately (fewer messages, a faster link, a
    faster reduction), so an explanation reports them apart."""

    latency: float
    bandwidth: float
    reduction: float


Terms = tuple[str, str, str]  # (ca, kb, kg) written out: what multiplies α, n·β and n·γ

# How the folded algorithms handle p that is not a power of two (MPICH's folding).
FOLD_NOTE = ("with p' = 2^⌊lg p⌋ and r = p - p' extra ranks: each extra rank first sends its buffer to a "
             "partner in the core (fold-in), the p' core ranks run the power-of-two algorithm, then the "
             "partners send the result back (fold-out); the two extra steps add the +2 and +1 terms")


@dataclass(frozen=True)
class Algorithm:
    op: str
    name: str
    schedule: Callable[[int, int, int], Schedule]
    coeffs: Callable[[int], Coeffs]
    units: Callable[[int, int], int]
    formula: str  # the textbook closed form in alpha/beta/gamma, p, n, for power-of-two p
    description: str
    min_p: int = 1
    # `coeffs` written out (tests evaluate these texts against `coeffs` for many p): `terms`
    # for powers of two, `any_p` (with `any_p_note` saying what the schedule does) where the
    # coefficients for other p differ. Symbols: p, p' = 2^⌊lg p⌋, r = p - p', ⌈lg p⌉, and
    # Σ over the binomial distances d = 1, 2, 4, ... below p (or p' in a folded core).
    terms: Terms = ("0", "0", "0")
    any_p: Terms | None = None
    any_p_note: str = ""

    def terms_for(self, p: int) -> tuple[Terms, str]:
        """The coefficient texts that `coeffs(p)` evaluates, and a note when p needs one."""
        if self.any_p is not None and p & (p - 1):
            return self.any_p, self.any_p_note
        return self.terms, ""

    def time(self, p: int, nbytes: float, alpha: float, beta: float, gamma: float) -> float:
        ca, kb, kg = self.coeffs(p)
        return ca * alpha + nbytes * (kb * beta + kg * gamma)

    def split(self, p: int, nbytes: float, alpha: float, beta: float, gamma: float) -> TimeSplit:
        """`time` term by term (their sum equals `time` up to rounding)."""
        ca, kb, kg = self.coeffs(p)
        return TimeSplit(ca * alpha, nbytes * kb * beta, nbytes * kg * gamma)


# =========================================================================== closed-form helpers
def _lg(p: int) -> int:
    return ceil_log2(p)


def _popcount_sum(p: int) -> int:
    return sum(bin(j).count("1") for j in range(p))


def _min_sum(p: int) -> int:
    """Sum over binomial distances d < p of min(d, p - d) (blocks per binomial step)."""
    return sum(min(d, p - d) for d in g.distances(p))


def _fold_sum(p: int) -> int:
    """Sum over recursive-halving/doubling distances of the heaviest group's blocks."""
    p2 = pow2_floor(p)
    r = p - p2
    return sum(d + min(r, d) for d in g.distances(p2))


def _ar_rd_coeffs(p: int) -> Coeffs:
    p2 = pow2_floor(p)
    l2 = p2.bit_length() - 1
    if p == p2:
        return (l2, l2, l2)
    return (l2 + 2, l2 + 2, l2 + 1)


def _ar_rab_coeffs(p: int) -> Coeffs:
    p2 = pow2_floor(p)
    l2 = p2.bit_length() - 1
    ca, kb, kg = 2 * l2, 2 * (p2 - 1) / p2, (p2 - 1) / p2
    if p != p2:
        ca, kb, kg = ca + 2, kb + 2, kg + 1
    return (ca, kb, kg)


def _ag_rd_coeffs(p: int) -> Coeffs:
    p2 = pow2_floor(p)
    l2 = p2.bit_length() - 1
    if p == p2:
        return (l2, p - 1, 0.0)
    return (l2 + 2, 1 + _fold_sum(p) + (p - 1), 0.0)


def _rs_halving_coeffs(p: int) -> Coeffs:
    p2 = pow2_floor(p)
    l2 = p2.bit_length() - 1
    if p == p2:
        return (l2, (p - 1) / p, (p - 1) / p)
    fs = _fold_sum(p)
    return (l2 + 2, 1 + fs / p + 1 / p, 1 + fs / p)


# =========================================================================== registry
def _A(op, name, sched, coeffs, units, formula, desc, terms: Terms, any_p: Terms | None = None,
       note: str = "") -> Algorithm:
    return Algorithm(op, name, sched, coeffs, units, formula, desc, terms=terms, any_p=any_p, any_p_note=note)


_MIN_NOTE = ("the binomial tree's subtrees are uneven, and the step at distance d moves min(d, p - d) "
             "blocks (d = 1, 2, 4, ... < p)")
_AG_FOLD = (FOLD_NOTE.replace("the +2 and +1 terms", "the +2 latency terms and the 1 and (p-1) blocks")
            + "; a core exchange at distance d (= 1, 2, 4, ... < p') moves its d blocks and min(r, d) folded ones")
_RS_FOLD = (FOLD_NOTE.replace("the +2 and +1 terms", "the +2 latency terms")
            + "; a core exchange at distance d (= 1, 2, 4, ... < p') moves d + min(r, d) of p blocks")


_ALGOS: list[Algorithm] = [
    _A(
        "all_reduce",
        "ring",
        g.ar_ring,
        lambda p: (2 * (p - 1), 2 * (p - 1) / p, (p - 1) / p),
        lambda p, c: 2 * (p - 1) * c,
        "2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ",
        "reduce-scatter then all-gather around a ring (Patarasuk & Yuan; NCCL ring, Gloo ring)",
        ("2(p-1)", "2(p-1)/p", "(p-1)/p"),
    ),
    _A(
        "all_reduce",
        "tree",
        g.ar_tree,
        lambda p: (2 * _lg(p), 2 * _lg(p), _lg(p)),
        lambda p, c: 2 * (p - 1) * c,
        "2⌈lg p⌉·α + 2⌈lg p⌉·n·β + ⌈lg p⌉·n·γ",
        "binomial-tree reduce to rank 0, then binomial-tree broadcast",
        ("2⌈lg p⌉", "2⌈lg p⌉", "⌈lg p⌉"),
    ),
    _A(
        "all_reduce",
        "recursive_doubling",
        g.ar_recursive_doubling,
        _ar_rd_coeffs,
        lambda p, c: (pow2_floor(p) * (pow2_floor(p).bit_length() - 1) + 2 * (p - pow2_floor(p))) * c,
        "lg p·(α + n·β + n·γ)",
        "pairwise exchange of the whole buffer at distances 1, 2, 4, ... (folded for non powers of two)",
        ("lg p", "lg p", "lg p"), ("lg p' + 2", "lg p' + 2", "lg p' + 1"), FOLD_NOTE,
    ),
    _A(
        "all_reduce",
        "rabenseifner",
        g.ar_rabenseifner,
        _ar_rab_coeffs,
        lambda p, c: (2 * (pow2_floor(p) - 1) + 2 * (p - pow2_floor(p))) * c,
        "2lg p·α + 2(p-1)/p·n·β + (p-1)/p·n·γ",
        "recursive-halving reduce-scatter then recursive-doubling all-gather (Rabenseifner)",
        ("2·lg p", "2(p-1)/p", "(p-1)/p"), ("2·lg p' + 2", "2(p'-1)/p' + 2", "(p'-1)/p' + 1"), FOLD_NOTE,
    ),
    _A(
        "broadcast",
        "tree",
        g.bc_tree,
        lambda p: (_lg(p), _lg(p), 0.0),
        lambda p, c: (p - 1) * c,
        "⌈lg p⌉·(α + n·β)",
        "binomial tree from the root",
        ("⌈lg p⌉", "⌈lg p⌉", "0"),
    ),
    _A(
        "broadcast",
        "scatter_allgather",
        g.bc_scatter_allgather,
        lambda p: (_lg(p) + p - 1, (_min_sum(p) + p - 1) / p, 0.0),
        lambda p, c: (_popcount_sum(p) + p * (p - 1)) * c // p,
        "(lg p + p - 1)·α + 2(p-1)/p·n·β",
        "binomial scatter then ring all-gather (van de Geijn)",
        ("lg p + p - 1", "2(p-1)/p", "0"), ("⌈lg p⌉ + p - 1", "(Σ min(d, p-d) + p - 1)/p", "0"), _MIN_NOTE,
    ),
    _A(
        "broadcast",
        "direct",
        g.bc_direct,
        lambda p: (p - 1, p - 1, 0.0),
        lambda p, c: (p - 1) * c,
        "(p-1)·(α + n·β)",
        "the root sends the whole buffer to each rank in turn",
        ("p - 1", "p - 1", "0"),
    ),
    _A(
        "reduce",
        "tree",
        g.rd_tree,
        lambda p: (_lg(p), _lg(p), _lg(p)),
        lambda p, c: (p - 1) * c,
        "⌈lg p⌉·(α + n·β + n·γ)",
        "binomial tree towards the root",
        ("⌈lg p⌉", "⌈lg p⌉", "⌈lg p⌉"),
    ),
    _A(
        "reduce",
        "direct",
        g.rd_direct,
        lambda p: (p - 1, p - 1, p - 1),
        lambda p, c: (p - 1) * c,
        "(p-1)·(α + n·β + n·γ)",
        "every rank sends to the root in turn",
        ("p - 1", "p - 1", "p - 1"),
    ),
    _A(
        "all_gather",
        "ring",
        g.ag_ring,
        lambda p: (p - 1, p - 1, 0.0),
        lambda p, c: p * (p - 1) * c,
        "(p-1)·α + (p-1)/p·N·β   (N = p·n, n = per-rank contribution)",
        "each rank forwards the block it received last step to its successor",
        ("p - 1", "p - 1", "0"),
    ),
    _A(
        "all_gather",
        "recursive_doubling",
        g.ag_recursive_doubling,
        _ag_rd_coeffs,
        lambda p, c: p * (p - 1) * c,
        "lg p·α + (p-1)/p·N·β   (N = p·n)",
        "exchange of doubling block groups at distances 1, 2, 4, ... (folded for non powers of two)",
        ("lg p", "p - 1", "0"), ("lg p' + 2", "1 + Σ (d + min(r, d)) + p - 1", "0"), _AG_FOLD,
    ),
    _A(
        "all_gather",
        "pairwise",
        g.ag_pairwise,
        lambda p: (p - 1, p - 1, 0.0),
        lambda p, c: p * (p - 1) * c,
        "(p-1)·α + (p-1)/p·N·β   (N = p·n)",
        "at step k every rank sends its own block to rank + k",
        ("p - 1", "p - 1", "0"),
    ),
    _A(
        "reduce_scatter",
        "ring",
        g.rs_ring,
        lambda p: (p - 1, (p - 1) / p, (p - 1) / p),
        lambda p, c: (p - 1) * c,
        "(p-1)·α + (p-1)/p·n·(β + γ)",
        "partial sums travel around the ring, one block per step",
        ("p - 1", "(p-1)/p", "(p-1)/p"),
    ),
    _A(
        "reduce_scatter",
        "recursive_halving",
        g.rs_recursive_halving,
        _rs_halving_coeffs,
        lambda p, c: (pow2_floor(p) - 1) * c + (p - pow2_floor(p)) * c + (p - pow2_floor(p)) * (c // p),
        "lg p·α + (p-1)/p·n·(β + γ)",
        "exchange of halving block ranges at distances p/2, p/4, ... (folded for non powers of two)",
        ("lg p", "(p-1)/p", "(p-1)/p"), ("lg p' + 2", "1 + (Σ (d + min(r, d)) + 1)/p", "1 + Σ (d + min(r, d))/p"), _RS_FOLD,
    ),
    _A(
        "reduce_scatter",
        "pairwise",
        g.rs_pairwise,
        lambda p: (p - 1, (p - 1) / p, (p - 1) / p),
        lambda p, c: (p - 1) * c,
        "(p-1)·α + (p-1)/p·n·(β + γ)",
        "at step k every rank sends block rank+k to rank + k",
        ("p - 1", "(p-1)/p", "(p-1)/p"),
    ),
    _A(
        "all_to_all",
        "pairwise",
        g.a2a_pairwise,
        lambda p: (p - 1, (p - 1) / p, 0.0),
        lambda p, c: (p - 1) * (c // p) * p,
        "(p-1)·α + (p-1)/p·n·β",
        "at step k every rank sends the block for rank + k",
        ("p - 1", "(p-1)/p", "0"),
    ),
    _A(
        "gather",
        "tree",
        g.gather_tree,
        lambda p: (_lg(p), _min_sum(p), 0.0),
        lambda p, c: _popcount_sum(p) * c,
        "lg p·α + (p-1)·n·β",
        "binomial tree towards the root, subtrees forwarding what they gathered",
        ("lg p", "p - 1", "0"), ("⌈lg p⌉", "Σ min(d, p-d)", "0"), _MIN_NOTE,
    ),
    _A(
        "gather",
        "direct",
        g.gather_direct,
        lambda p: (p - 1, p - 1, 0.0),
        lambda p, c: (p - 1) * c,
        "(p-1)·(α + n·β)",
        "every rank sends its block to the root in turn",
        ("p - 1", "p - 1", "0"),
    ),
    _A(
        "scatter",
        "tree",
        g.scatter_tree,
        lambda p: (_lg(p), _min_sum(p) / p, 0.0),
        lambda p, c: _popcount_sum(p) * c // p,
        "lg p·α + (p-1)/p·n·β",
        "binomial tree from the root, each child getting its subtree's blocks",
        ("lg p", "(p-1)/p", "0"), ("⌈lg p⌉", "Σ min(d, p-d)/p", "0"), _MIN_NOTE,
    ),
    _A(
        "scatter",
        "direct",
        g.scatter_direct,
        lambda p: (p - 1, (p - 1) / p, 0.0),
        lambda p, c: (p - 1) * c // p,
        "(p-1)·α + (p-1)/p·n·β",
        "the root sends each rank its block in turn",
        ("p - 1", "(p-1)/p", "0"),
    ),
    _A(
        "barrier",
        "dissemination",
        g.barrier_dissemination,
        lambda p: (_lg(p), 0.0, 0.0),
        lambda p, c: 0,
        "⌈lg p⌉·α",
        "at step k rank i signals rank i + 2^k (Hensgen, Finkel & Manber)",
        ("⌈lg p⌉", "0", "0"),
    ),
    _A(
        "barrier",
        "tree",
        g.barrier_tree,
        lambda p: (2 * _lg(p), 0.0, 0.0),
        lambda p, c: 0,
        "2⌈lg p⌉·α",
        "binomial gather of empty messages to rank 0, then binomial release",
        ("2⌈lg p⌉", "0", "0"),
    ),
]

REGISTRY: dict[tuple[str, str], Algorithm] = {(a.op, a.name): a for a in _ALGOS}

ALIASES: dict[str, str] = {
    "binomial": "tree",
    "binomial_tree": "tree",
    "rd": "recursive_doubling",
    "rh": "recursive_halving",
    "halving_doubling": "rabenseifner",
    "rs_ag": "rabenseifner",
    "direct": "direct",
    "van_de_geijn": "scatter_allgather",
    "linear": "direct",
}


def algorithms_for(op: str) -> list[str]:
    return [a.name for a in _ALGOS if a.op == op]


def resolve(op: str, algo: str | None, field: str = "algo", op_field: str | None = None) -> str | None:
    """Canonical algorithm name, or None for 'auto'. Raises ScenarioError naming `field`
    (`op_field` for an unknown op, where the op is given apart from the algorithm)."""
    if op not in COLLECTIVE_OPS:
        raise ScenarioError(f"{op_field or field}: unknown collective '{op}' (choose from {', '.join(COLLECTIVE_OPS)})")
    if algo is None or algo == "auto":
        return None
    name = algo.strip().lower().replace("-", "_")
    name = ALIASES.get(name, name)
    if (op, name) not in REGISTRY:
        raise ScenarioError(
            f"{field}: unknown algorithm '{algo}' for {op} (choose from auto, {', '.join(algorithms_for(op))})"
        )
    return name


def get(op: str, algo: str) -> Algorithm:
    name = resolve(op, algo)
    assert name is not None
    return REGISTRY[(op, name)]


def make_schedule(op: str, algo: str, p: int, count: int, root: int = 0) -> Schedule:
    """The schedule of `algo` for `op` on p ranks with `count` units per rank.

    The last few are kept (a schedule is never changed once built, and its step columns
    are read-only): `simdist explain` reads the same 2-million-message schedule for its
    step table and for its simulation, and builds it once."""
    a = get(op, algo)
    if p < a.min_p:
        raise ScenarioError(f"ranks: {op}/{a.name} needs at least {a.min_p} ranks, got {p}")
    if not 0 <= root < max(p, 1):
        raise ScenarioError(f"root: rank {root} out of range for {p} ranks")
    return _built(a.op, a.name, p, count, root)


@lru_cache(maxsize=4)
def _built(op: str, algo: str, p: int, count: int, root: int) -> Schedule:
    return REGISTRY[(op, algo)].schedule(p, count, root)
