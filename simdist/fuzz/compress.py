"""Schedule compression: judge a long uneven-input schedule by simulating a shorter one.

In a Join loop the iterations between two consecutive distinct per-rank input counts (a
*gap*: the set of ranks that have run out of inputs is constant) are periodic in the
iteration index ``i`` once warm-up is over. A live rank's iteration depends on ``i`` only
through its steps' conditions (nested ``not``/``any`` ones and conditional values included):
with ``P = lcm(every)`` and ``T`` the largest ``below`` / ``from_iteration`` threshold, each
condition is a boolean combination of ``i % every == offset``, ``i < T`` and ``i >= T``, so
the steps iteration ``i >= T`` runs depend on ``i mod P`` alone. The rest of a rank's state either settles once (DDP rebuilds its buckets at the
first forward after a synchronised backward; a joined rank pushes and rebuilds in its first
two shadow passes) or is rewritten every period (DDP's sync flags, Join's
``is_last_joiner``). A joined rank's shadow pass does not depend on ``i`` at all. Ranks
never look ahead: nothing a rank does at iteration ``i`` depends on how many inputs it has
left. So once a gap has reached its steady state, removing ``k * P`` iterations from it
(and from the count of every rank whose count lies beyond it) leaves a schedule whose
ranks go through the same states in the same order, only fewer times: the same outcome,
the same per-rank status and error, the same kinds of findings, and per-rank
``inputs_processed`` shifted by the iterations removed before the point the rank reached.

Only values are not preserved (a Counter's count, observed all-reduce results, the
simulated time), and none of them steers control flow in the models or enters the
checker's verdict, except where excluded below.

Conditions (``plan(scenario).reason`` says which one failed; no compression then):

* no ``stop`` step and no ``flag`` condition in the loop (they leave the loop, or branch, on
  what happened, not on ``i``);
* no ``p2p`` step in the loop (FIFO matching across iterations is not reasoned about);
* no loop step with ``value = "iteration"`` (its payload then depends on ``i``);
* no loop step that observes ``counter.max_count`` / ``allreducer.post_hook_tensor`` (the
  checker compares those observed values across ranks);
* no async loop collective with ``wait = "never"`` (nothing then keeps the ranks in step,
  so their skew in simulated time grows with the number of iterations);
* only the bundled joinable kinds (``counter``, ``allreducer``; ``ddp``, ``zero``);
* ``P = lcm(every) <= MAX_PERIOD`` (12).

What is kept: every iteration ``i < W = T + 2P`` (warm-up), and in every gap ``[v, v')``
its first ``J`` iterations (``J = P`` when every rank that joins at ``v`` already ran ``W``
live iterations, else ``3P``: it may still have to push and rebuild its buckets in its
shadow passes, which run at least once a period), so each gap's own transient is simulated
and no two distinct counts merge. From the steady part of each gap the largest multiple of
``P`` is removed.

Why ``W = T + 2P`` is enough: from ``T`` on, the steps an iteration runs repeat every ``P``
iterations, so a piece of state that is rewritten at all after ``T`` is rewritten in every
period, and its value at the start of iteration ``i >= T + P`` is the one left by the
period before, which is periodic itself (the sync flags, Join's counts and hooks). The only
state that settles once is DDP's bucket rebuild, a chain of two events: a synchronised
backward fills ``rebuilt_params`` and the next forward rebuilds. If the periodic part of
the loop synchronises a backward at all, it does so by ``T + P - 1``, and the loop's next
forward comes at most ``P`` iterations later, so the rebuild happens by iteration
``T + 2P - 1`` and every iteration from ``T + 2P`` on is steady: removing whole periods
there maps steady iterations onto steady iterations. (A rebuild before ``T`` only settles
it sooner; with no synchronised backward after ``T``, or no forward after it, none comes.)
The warm-up used to be ``T + 3P + 1``, one period and an iteration more than this needs
(a fifth of a fuzzed DDP schedule's simulated iterations); tests/test_compress.py checks
the shorter one on random loops mixing ``every``, ``below``, ``from_iteration``, ``ranks``
and ``no_sync`` conditions, and tests/test_fuzz_verdicts.py on every bundled template.

Checked on the compressed run (`untrusted`): the static conditions make each rank's own
behaviour periodic, not the pairing of collectives across ranks, so a compressed run only
stands for the full one when every collective paired calls of one origin or a live call
with the join hook's shadow of it (`misaligned`), and no rank ran past a cut while another
was stuck before it. The fuzzer (`simdist.fuzz.checker.Checker`) goes further and uses
only compressed *passes*; everything else is simulated in full.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from operator import attrgetter
from typing import Any

from simdist.engine.core import CostLike
from simdist.fuzz.counterexample import canonical
from simdist.program.shapes import ShapeMemo
from simdist.report import Report
from simdist.scenario import CollectiveStep, Inputs, P2PStep, Scenario, Step, StopStep, ValueWhen, When

MAX_PERIOD = 12
WARM_PERIODS = 2  # warm-up W = T + WARM_PERIODS * P (see the module docstring)
UNSETTLED_PERIODS = 3  # kept at a gap's start when its joiners ran fewer than W iterations
# observed values the checker compares across ranks (simdist.check.classify.invariant_findings)
_CHECKED_OBSERVED = ("counter.max_count", "allreducer.post_hook_tensor")
_KNOWN_JOINABLES = ("counter", "allreducer")


@dataclass(frozen=True)
class Plan:
    """How a scenario is compressed: which iterations of the full schedule are removed."""

    counts: tuple[int, ...]  # the full schedule's per-rank input counts
    period: int = 1
    threshold: int = 0
    # (first removed iteration, number removed) in the full schedule's iteration index, ascending
    segments: tuple[tuple[int, int], ...] = ()
    reason: str = ""  # why nothing is removed ("" when the conditions hold)
    compressed_counts: tuple[int, ...] = field(default=())

    @property
    def compressed(self) -> bool:
        return bool(self.segments)

    def removed(self) -> list[int]:
        """Per-rank number of iterations removed (those of every segment below its count)."""
        return [sum(n for a, n in self.segments if a + n <= c) for c in self.counts]

    def cuts(self) -> list[int]:
        """Where each segment was removed, as an iteration index of the compressed schedule."""
        out, shift = [], 0
        for a, length in self.segments:
            out.append(a - shift)
            shift += length
        return out

    def full_inputs_processed(self, n: int) -> int:
        """A rank that completed `n` iterations of the compressed schedule completed this many of the full one.

        A segment counts once the rank got past it: it completed the compressed iteration that
        follows the segment, or the segment ends its gap (its end is an input count) and the rank
        reached that count (it completed it, or stopped in the next gap's first iteration)."""
        shift = 0
        for a, length in self.segments:
            at = a - shift  # the segment's position in the compressed schedule
            if n > at or (n == at and a + length in self.counts):
                shift += length
            else:
                break
        return n + shift


def _lcm(xs: list[int]) -> int:
    out = 1
    for x in xs:
        out = out * x // math.gcd(out, x)
    return out


def _conditions(st: Step) -> list[When]:
    """Every condition a loop step evaluates: its own (nested ones included) and its value's."""
    value = getattr(st, "value", None)
    return list(st.parts()) + (list(value.when.parts()) if isinstance(value, ValueWhen) else [])


def _periodicity(s: Scenario) -> tuple[str, int, int]:
    """(why the loop cannot be compressed, or ""; its period; its threshold): what `plan`
    reads of everything but the inputs, worked out once per scenario shape."""
    for k, st in enumerate(s.loop):
        if isinstance(st, StopStep):
            return f"loop[{k}] is a stop step", 1, 0
        if any(c.flag is not None for c in _conditions(st)):
            return f"loop[{k}] depends on an observed flag", 1, 0
        if isinstance(st, P2PStep):
            return f"loop[{k}] is a p2p step", 1, 0
        if isinstance(st, CollectiveStep):
            if st.value == "iteration":
                return f"loop[{k}] sends value = \"iteration\"", 1, 0
            if st.observe in _CHECKED_OBSERVED:
                return f"loop[{k}] observes {st.observe}, which the checker compares", 1, 0
            if st.async_op and st.wait == "never":
                return f"loop[{k}] is never waited", 1, 0
    for j in s.joinables:
        if j.kind not in _KNOWN_JOINABLES:
            return f"joinable {j.name} has kind {j.kind}", 1, 0
    conds = [c for st in s.loop for c in _conditions(st)]
    period = _lcm([c.every for c in conds if c.every is not None])
    if period > MAX_PERIOD:
        return f"period {period} > {MAX_PERIOD}", 1, 0
    thresholds = [x for c in conds for x in (c.below, c.from_iteration) if x is not None]
    return "", period, max(thresholds, default=0)


_PERIODICITY = ShapeMemo()


def plan(s: Scenario) -> Plan:
    """Decide what can be removed from `s` without changing its verdict (see the module docstring)."""
    counts = tuple(s.counts())
    no = Plan(counts=counts, compressed_counts=counts)
    why, period, threshold = _PERIODICITY.get(s, "plan", lambda: _periodicity(s))
    if why:
        return Plan(counts=counts, compressed_counts=counts, reason=why)
    warm = threshold + WARM_PERIODS * period
    values = sorted(set(counts) | {0})
    segments: list[tuple[int, int]] = []
    for v, nxt in zip(values, values[1:], strict=False):
        # ranks joining at v (count == v): settled when they ran `warm` live iterations
        joiners_settled = v >= warm if v > 0 else 0 not in counts
        keep = period if joiners_settled else UNSETTLED_PERIODS * period
        start = max(v + keep, warm)
        k = (nxt - start) // period
        if k >= 1:
            segments.append((start, k * period))
    if not segments:
        return no
    p = Plan(counts=counts, period=period, threshold=threshold, segments=tuple(segments))
    removed = p.removed()
    return Plan(counts=counts, period=period, threshold=threshold, segments=tuple(segments),
                compressed_counts=tuple(c - r for c, r in zip(counts, removed, strict=True)))


# Collectives a joined rank's shadow pass issues to match a live rank's (Join's heartbeat
# count, the join hooks' shadow all-reduces and broadcasts): the only origins that may meet
# in one collective of an aligned run.
SHADOW_PAIRS: tuple[frozenset[str], ...] = tuple(frozenset(x) for x in (
    ("join.notify_join_context.heartbeat", "join.exit.count_nonjoined"),
    ("ddp.pre_forward.rebuild_buckets", "ddp.join_hook.rebuild_buckets"),
    ("ddp.pre_forward.find_common_rank", "ddp.join_hook.find_common_rank"),
    ("ddp.pre_forward.sync_buffers", "ddp.join_hook.sync_buffers"),
    ("ddp.pre_forward.requires_grad_sync", "ddp.join_hook.requires_grad_sync"),
    ("ddp.backward.bucket_allreduce", "ddp.join_hook.bucket_allreduce"),
    ("ddp.backward.unused_map_allreduce", "ddp.join_hook.unused_map_allreduce"),
    ("zero.step.broadcast_shard", "zero.join_hook.broadcast_shard"),
    ("counter.call.allreduce", "counter.main_hook.allreduce"),
    ("allreducer.call.allreduce", "allreducer.main_hook.allreduce"),
))


_GROUP_SEQ_ORIGIN_OP = attrgetter("group", "seq", "origin", "op")


def misaligned(report: Report) -> str:
    """Why `report`'s ranks are out of step ("" when they are not).

    The static conditions make every rank's own behaviour periodic, but not the pairing of
    collectives across ranks: a joined rank whose shadow pass issues more (or fewer)
    collectives than a live iteration slides against the live ranks, one collective further
    each iteration, and then what the run does depends on the length of the gap (even when
    every pair happens to have equal fingerprints, so no finding shows it). A run in which
    every collective pairs calls of one origin, or a live rank's call with the shadow call
    that the join hooks issue for it (`SHADOW_PAIRS`), is in step."""
    # Whether any collective pairs origins that no shadow pair allows, from the set of distinct
    # (group, seq, origin, op), built at C speed (a run has one or two per collective): only a
    # run that is out of step takes the walk below, which names the first offending collective.
    # (Was: a set of (group, seq, origin) settling runs with one origin per collective, then
    # the walk; but a run with a joined rank pairs shadows, so the fuzzer's runs nearly all
    # took both: 185 us a run of the benchmark's stream, against 132 us for this.)
    seen: set[tuple[str, int, str, str]] = set()
    for r in report.ranks:
        seen.update(map(_GROUP_SEQ_ORIGIN_OP, r.trace))
    origins: dict[tuple[str, int], set[str]] = {}
    for g, q, o, op in seen:
        if op != "send" and op != "recv":
            origins.setdefault((g, q), set()).add(o)
    if all(len(o) == 1 or any(o <= pair for pair in SHADOW_PAIRS) for o in origins.values()):
        return ""
    # every collective's first origin, and the set of origins only where they differ (most
    # pair one origin: a set per collective was a fifth of a fuzzed schedule's checking)
    first: dict[tuple[str, int], str] = {}
    mixed: dict[tuple[str, int], set[str]] = {}
    for r in report.ranks:
        for e in r.trace:
            if e.op in ("send", "recv"):
                continue
            k = (e.group, e.seq)
            o = first.setdefault(k, e.origin)
            if o != e.origin:
                mixed.setdefault(k, {o}).add(e.origin)
    for k in first if mixed else ():  # in order of first sight, as the message names the first
        o = mixed.get(k)
        if o is not None and not any(o <= pair for pair in SHADOW_PAIRS):
            return f"#{k[1]} on {k[0]} pairs {', '.join(sorted(o))}"
    return ""


def untrusted(p: Plan, report: Report) -> str:
    """Why the compressed run `report` of plan `p` may not stand for the full one ("" when it may).

    Its ranks must be in step (`misaligned`), and if some rank got stuck inside its loop,
    at compressed iteration x (the first such), no rank may have reached the first cut after
    x, nor may x be a cut itself: the periodicity argument holds for the system as a whole,
    so a rank that runs ahead of a stuck one past a cut could, in the full schedule, have
    stopped inside the removed iterations instead. A passing run has no stuck rank."""
    why = misaligned(report)
    if why:
        return why
    cuts = p.cuts()
    counts = p.compressed_counts
    stuck = [r.inputs_processed for r in report.ranks
             if r.status != "completed" and r.inputs_processed < counts[r.rank]]
    if not stuck:
        return ""
    x = min(stuck)
    if x in cuts:
        return f"a rank stopped at a cut (compressed iteration {x})"
    after = [c for c in cuts if c > x]
    if after and any(r.inputs_processed >= after[0] for r in report.ranks):
        return f"a rank stopped at compressed iteration {x} while another reached the cut at {after[0]}"
    return ""


def apply(s: Scenario, p: Plan) -> Scenario:
    """The compressed scenario of plan `p` (explicit per-rank counts; everything else unchanged)."""
    if not p.compressed:
        return s
    return s.model_copy(update={"inputs": Inputs(counts=list(p.compressed_counts))})


def compress(s: Scenario) -> tuple[Scenario, list[int]]:
    """(compressed scenario, per-rank number of iterations removed); `s` itself when nothing can be removed."""
    p = plan(s)
    return apply(s, p), p.removed()


def verdict_key(d: dict[str, Any], p: Plan) -> tuple[str, tuple[int, ...], tuple[int, ...]]:
    """What `passes_compressed(parse_scenario(d), p)` depends on, as a cache key: the scenario
    dict without its inputs (canonical JSON), the compressed per-rank counts and where the
    cuts lie.

    `passes_compressed` reads `s` and `p` only through ``apply(s, p)`` (simulated and
    checked), ``p.cuts()`` and ``p.compressed_counts`` (`untrusted`; the counts are the
    compressed scenario's own), and the simulator is deterministic. ``apply(s, p)`` is `s`
    with its inputs replaced by ``Inputs(counts=p.compressed_counts)``, and every other field
    of ``s = parse_scenario(d)`` is the validated value of ``d``'s own key (the one validator
    that looks across fields, `Scenario._cross_check`, only checks). So two schedules with
    the same key get the same answer, by construction rather than by the periodicity
    argument: distinct full schedules whose steady gaps differ in length meet here, and a
    fuzzer simulates their shared compressed run once (tests/test_fuzz_verdicts.py compares
    cached and fresh verdicts over many schedules, and the compressed scenarios of equal
    keys). The key used to be ``apply(s, p).model_dump_json()``: the same equivalence, but
    in the fuzz loop (pydantic's serializer cold after hypothesis's turn) it took 0.165 ms a
    schedule against 0.028 ms for this one (timed side by side on the benchmark's stream)."""
    rest = {k: v for k, v in d.items() if k != "inputs"}
    return canonical(rest), tuple(p.compressed_counts), tuple(p.cuts())


def passes_compressed(s: Scenario, p: Plan, *, invariants: bool = True, cost: CostLike | None = None) -> bool:
    """True when the compressed schedule of plan `p` passes the fuzz property and may stand for
    the full one (`untrusted`), so the full schedule `s` passes too; False means "unknown:
    simulate `s` in full". `cost`: the cost model to simulate with (default: the scenario's)."""
    from simdist.check.classify import passes
    from simdist.sim import simulate

    if not p.compressed:
        return False
    c = apply(s, p)
    report = simulate(c, cost)
    if untrusted(p, report):
        return False
    return passes(report, c, invariants=invariants)
