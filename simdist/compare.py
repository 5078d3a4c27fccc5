"""Diff a simulated Report against a real one, rank by rank (pure: no torch, no processes).

Per rank, in this order:

* the collective trace, entry by entry on `TraceEntry.key()` (op, numel, dtype, group,
  group size, origin, a p2p operation's peer); the first diverging entry is reported with
  both sides; when the traces agree, each entry's reduce op and root where the real side
  knows them (its recorder may not: DDP's C++ bucket all-reduces keep neither);
* where the rank's code was blocked or left (a script's `location`: file and line);
* a real rank that ended with no record (a script's rank on real Gloo sends its Flight
  Recorder when it exits, or, in a hang, when the launcher asks before the watchdog kills it:
  a SIGABRT, or a hung rank that did not answer in time, loses it) has no trace, no location
  and no blocked operation to compare: those are skipped for it, so such a rank is compared
  by status, inputs and printed lines only (`RankComparison.unrecorded` says so);
* status and inputs processed;
* the error: its category, and for Python-level errors raised by Join or the models
  (categories `join_early_termination` and `model`) also the exception type and the
  normalised first line of the message (`report.normalise_message`); backend errors
  (peer lost, Gloo abort, timeout, signals) carry addresses and ports, so only their
  category is compared;
* observed values: same names, equal values (numbers within a small tolerance, lists
  element by element, None only equals None);
* for ranks that hang on both sides, the key of the collective they are blocked in;
* the lines the rank printed to stdout (a script's own output; scenarios print none), the
  first differing line with both sides. Its stderr is not compared: tracebacks and
  warnings name the code path (simdist's process group or Gloo's), not the program.

Plus the run-level outcome and world size. `Comparison.agree` is True when nothing differs.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from typing import Any, Protocol

from simdist.report import RankError, RankResult, Report, TraceEntry, normalise_message

REL_TOL = 1e-5
ABS_TOL = 1e-6
# What `simdist compare` says when every difference is a race of the real run (`simdist.races`)
AGREE_UP_TO_A_RACE = "agree up to a race of the real run, not a model difference"
# Error categories whose message comes from Python code (Join, DDP, ZeRO) and is compared.
MESSAGE_CATEGORIES = frozenset({"join_early_termination", "model"})


@dataclass
class Difference:
    """One disagreement; `rank` is None for run-level fields."""

    # outcome | world_size | ranks | trace | reduce_op | root | location | status | inputs_processed | error |
    # observed | blocked_in | output
    field: str
    rank: int | None
    sim: Any
    real: Any
    detail: str
    index: int | None = None  # trace, output: position (0-based) of the first diverging entry or line


@dataclass
class RankComparison:
    rank: int
    differences: list[Difference] = field(default_factory=list)
    sim_collectives: int = 0
    real_collectives: int = 0
    unrecorded: bool = False  # the real rank ended with no record (see the module's docstring)

    @property
    def agree(self) -> bool:
        return not self.differences


@dataclass
class Comparison:
    """Sim against real for one scenario: `agree`, run-level and per-rank differences."""

    scenario: str
    agree: bool
    differences: list[Difference]
    ranks: list[RankComparison]
    sim_outcome: str
    real_outcome: str

    def to_dict(self) -> dict[str, Any]:
        d = asdict(self)
        for r, rc in zip(d["ranks"], self.ranks, strict=True):
            r["agree"] = rc.agree
        return d


def _entry_summary(e: TraceEntry | None) -> dict[str, Any] | None:
    if e is None:
        return None
    return {
        "seq": e.seq,
        "op": e.op,
        "numel": e.numel,
        "dtype": e.dtype,
        "group": e.group,
        "group_size": e.group_size,
        "origin": e.origin,
        "peer": e.peer,
    }


def _short(e: TraceEntry | None) -> str:
    return "(nothing)" if e is None else e.short()


def values_equal(a: Any, b: Any) -> bool:
    """Observed-value equality: numbers within tolerance (bools as numbers), lists element-wise."""
    if a is None or b is None:
        return a is None and b is None
    if isinstance(a, (list, tuple)) or isinstance(b, (list, tuple)):
        if not (isinstance(a, (list, tuple)) and isinstance(b, (list, tuple))) or len(a) != len(b):
            return False
        return all(values_equal(x, y) for x, y in zip(a, b, strict=True))
    if isinstance(a, (int, float)) and isinstance(b, (int, float)):
        fa, fb = float(a), float(b)
        if math.isnan(fa) or math.isnan(fb):
            return math.isnan(fa) and math.isnan(fb)
        return math.isclose(fa, fb, rel_tol=REL_TOL, abs_tol=ABS_TOL)
    return a == b


def _compare_trace(rc: RankComparison, sim: list[TraceEntry], real: list[TraceEntry], aborted: bool = False) -> None:
    """First position where the traces differ, if any.

    For a rank that Gloo aborted on both sides, the simulated trace must be an exact prefix
    of the real one: after the I/O thread hits the failed size check, the rank's main thread
    keeps enqueuing async collectives until SIGABRT lands, and how many it manages is a race
    in the real system (seen: 5 and 8 in two real runs of one scenario), not a model property.
    A real rank that aborted with no trace at all kept no record (a script's rank reports its
    Flight Recorder as it exits, which a SIGABRT prevents): there is nothing to compare.
    """
    if aborted and not real:
        return
    n = min(len(sim), len(real))
    idx = next((i for i in range(n) if sim[i].key() != real[i].key()), None)
    if idx is None and len(sim) != len(real) and not (aborted and len(real) > len(sim)):
        idx = n
    if idx is None:
        return
    s = sim[idx] if idx < len(sim) else None
    r = real[idx] if idx < len(real) else None
    rc.differences.append(
        Difference(
            "trace",
            rc.rank,
            _entry_summary(s),
            _entry_summary(r),
            f"collective {idx + 1} differs (sim {len(sim)}, real {len(real)} in all): sim {_short(s)} | real {_short(r)}",
            index=idx,
        )
    )


def error_view(e: RankError | None) -> dict[str, Any] | None:
    """What of a rank's error the program determines, so what two runs must agree on: the
    category, and the message only where Python raised it. A backend's wording is not: Gloo
    says "Connection closed by peer" or "Read error: Connection reset by peer" for the same
    lost peer, by whether the peer's socket still held unread bytes when it closed (a TCP
    FIN or RST; on this machine about 1 run in 12 of `tests/scenarios_real/peer_lost.toml`
    gets the second)."""
    if e is None:
        return None
    view: dict[str, Any] = {"category": e.category}
    if e.category in MESSAGE_CATEGORIES:
        view["type"] = e.type
        view["message"] = normalise_message(e.message)
    return view


def _compare_rank(sim: RankResult, real: RankResult) -> RankComparison:
    rc = RankComparison(sim.rank, sim_collectives=len(sim.trace), real_collectives=len(real.trace),
                        unrecorded=_unrecorded(real))
    if not rc.unrecorded:
        _compare_trace(rc, sim.trace, real.trace, aborted=sim.status == real.status == "aborted")
        _compare_args(rc, sim.trace, real.trace)
        sw, rw = _where(sim), _where(real)
        if sw != rw:
            rc.differences.append(Difference("location", sim.rank, sw, rw, f"ended at: sim {_at(sw)} | real {_at(rw)}"))
    if sim.status != real.status:
        rc.differences.append(
            Difference("status", sim.rank, sim.status, real.status, f"status: sim {sim.status}, real {real.status}")
        )
    if sim.inputs_processed != real.inputs_processed:
        rc.differences.append(
            Difference(
                "inputs_processed",
                sim.rank,
                sim.inputs_processed,
                real.inputs_processed,
                f"inputs processed: sim {sim.inputs_processed}, real {real.inputs_processed}",
            )
        )
    se, re_ = error_view(sim.error), error_view(real.error)
    if se != re_:
        rc.differences.append(
            Difference(
                "error",
                sim.rank,
                se,
                re_,
                f"error: sim {_error_text(sim.error)} | real {_error_text(real.error)}",
            )
        )
    for name in sorted(set(sim.observed) | set(real.observed)):
        sv, rv = sim.observed.get(name, _MISSING), real.observed.get(name, _MISSING)
        if sv is _MISSING or rv is _MISSING or not values_equal(sv, rv):
            rc.differences.append(
                Difference(
                    "observed",
                    sim.rank,
                    None if sv is _MISSING else sv,
                    None if rv is _MISSING else rv,
                    f"observed {name}: sim {_fmt(sv)}, real {_fmt(rv)}",
                )
            )
    if sim.status == "hang" and real.status == "hang" and not rc.unrecorded:
        # a call's own message below Python (a monitored barrier's, TORCH_DISTRIBUTED_DEBUG=DETAIL's
        # checks: `TraceEntry.within`) is no Flight Recorder entry: real Gloo shows none there
        sk = sim.blocked_in.key() if sim.blocked_in and not sim.blocked_in.within else None
        rk = real.blocked_in.key() if real.blocked_in else None
        if sk != rk:
            rc.differences.append(
                Difference(
                    "blocked_in",
                    sim.rank,
                    _entry_summary(sim.blocked_in),
                    _entry_summary(real.blocked_in),
                    f"blocked in: sim {_short(sim.blocked_in)} | real {_short(real.blocked_in)}",
                )
            )
    _compare_output(rc, sim.output, real.output)
    return rc


def _unrecorded(real: RankResult) -> bool:
    """A real rank killed before it could record: aborted with no trace, or (a script's
    rank that the watchdog ended in a hang without its answer to the request for its record,
    `Coordinator.collect_records`) with no trace, no line and no blocked operation, or killed
    by a signal with no trace and no line (`mp.spawn` SIGTERMs the other workers once one
    raised: one that was blocked in a collective may die before it reports, or after, by a
    race); a rank that recorded anything, or completed, is compared in full."""
    if real.trace:
        return False
    killed = real.error is not None and real.error.category == "killed" and real.location is None
    return killed or real.status == "aborted" or (real.status == "hang" and real.location is None
                                                  and real.blocked_in is None)


def _compare_args(rc: RankComparison, sim: list[TraceEntry], real: list[TraceEntry]) -> None:
    """Reduce op and root of each entry, where the traces agree and the real side knows them."""
    if any(d.field == "trace" for d in rc.differences):
        return
    for i, (a, b) in enumerate(zip(sim, real, strict=False)):
        for name in ("reduce_op", "root"):
            sv, rv = getattr(a, name), getattr(b, name)
            if rv is not None and sv != rv:
                rc.differences.append(Difference(
                    name, rc.rank, sv, rv, f"collective {i + 1} ({b.short()}): {name} sim {sv}, real {rv}", index=i))


def _where(r: RankResult) -> tuple[str, int] | None:
    return (r.location.file, r.location.line) if r.location is not None else None


def _at(w: tuple[str, int] | None) -> str:
    return "(unknown)" if w is None else f"{w[0].rsplit('/', 1)[-1]}:{w[1]}"


def _compare_output(rc: RankComparison, sim: list[str], real: list[str]) -> None:
    """The first printed line that differs (or where one side stops printing)."""
    n = min(len(sim), len(real))
    idx = next((i for i in range(n) if sim[i] != real[i]), None)
    if idx is None and len(sim) != len(real):
        idx = n
    if idx is None:
        return
    s = sim[idx] if idx < len(sim) else None
    r = real[idx] if idx < len(real) else None
    rc.differences.append(Difference(
        "output", rc.rank, s, r,
        f"printed line {idx + 1} differs (sim {len(sim)}, real {len(real)} lines): sim {_line(s)} | real {_line(r)}",
        index=idx))


class _Missing:
    def __repr__(self) -> str:
        return "(missing)"


_MISSING = _Missing()


def _line(text: str | None) -> str:
    return "(no such line)" if text is None else repr(text)


def _fmt(v: Any) -> str:
    return repr(v)


def _error_text(e: RankError | None) -> str:
    if e is None:
        return "none"
    first = e.message.strip().splitlines()[0] if e.message.strip() else ""
    return f"[{e.category}] {e.type}: {first[:160]}"


def compare_reports(sim: Report, real: Report) -> Comparison:
    """Field-by-field comparison of a simulated and a real report of the same scenario."""
    diffs: list[Difference] = []
    if sim.outcome != real.outcome:
        diffs.append(
            Difference("outcome", None, sim.outcome, real.outcome, f"outcome: sim {sim.outcome}, real {real.outcome}")
        )
    if sim.world_size and real.world_size and sim.world_size != real.world_size:
        diffs.append(
            Difference(
                "world_size",
                None,
                sim.world_size,
                real.world_size,
                f"world size: sim {sim.world_size}, real {real.world_size}",
            )
        )
    sim_by = {r.rank: r for r in sim.ranks}
    real_by = {r.rank: r for r in real.ranks}
    ranks: list[RankComparison] = []
    for rank in sorted(set(sim_by) | set(real_by)):
        if rank not in sim_by or rank not in real_by:
            diffs.append(
                Difference(
                    "ranks",
                    rank,
                    rank in sim_by,
                    rank in real_by,
                    f"rank {rank} only in the {'sim' if rank in sim_by else 'real'} report",
                )
            )
            continue
        rc = _compare_rank(sim_by[rank], real_by[rank])
        ranks.append(rc)
        diffs.extend(rc.differences)
    return Comparison(
        scenario=real.scenario or sim.scenario,
        agree=not diffs,
        differences=diffs,
        ranks=ranks,
        sim_outcome=sim.outcome,
        real_outcome=real.outcome,
    )


class Explained(Protocol):
    """What explains every difference of a comparison without a fault of the model: a race of
    the real run (`simdist.races.named_races`), said in one line."""

    def describe(self) -> str: ...


def format_comparison(c: Comparison, races: Sequence[Explained] = ()) -> str:
    """Human-readable per-rank diff (one summary line when everything agrees). With `races`
    (which explain every difference: `simdist.races.named_races`) the head says the runs
    agree up to them and each race's line follows; the differences they made are listed."""
    if c.agree:
        head = f"{c.scenario}: sim and real agree (outcome {c.real_outcome})"
    elif races:
        head = (f"{c.scenario}: sim and real {AGREE_UP_TO_A_RACE} (outcome sim {c.sim_outcome}, real "
                f"{c.real_outcome}); what it changed is below")
    else:
        head = f"{c.scenario}: sim and real DIFFER (outcome sim {c.sim_outcome}, real {c.real_outcome})"
    lines = [head] + [f"  race: {r.describe()}" for r in races if not c.agree]
    for d in c.differences:
        if d.rank is None:
            lines.append(f"  {d.detail}")
    for rc in c.ranks:
        mark = "agree" if rc.agree else "differ"
        note = "; the real rank was ended with no record (killed by a signal, or a hang's watchdog killed it " \
            "before it answered for its record): operations and line not compared" if rc.unrecorded else ""
        lines.append(f"  rank {rc.rank}: {mark} ({rc.sim_collectives} sim / {rc.real_collectives} real collectives{note})")
        for d in rc.differences:
            if d.field == "trace":
                lines.append(f"    first diverging collective: #{(d.index or 0) + 1} in issue order")
                lines.append(f"      sim : {_entry_line(d.sim)}")
                lines.append(f"      real: {_entry_line(d.real)}")
            else:
                lines.append(f"    {d.detail}")
    for d in c.differences:
        if d.field == "ranks":
            lines.append(f"  {d.detail}")
    return "\n".join(lines)


def _entry_line(s: dict[str, Any] | None) -> str:
    if s is None:
        return "(none: the trace ends here)"
    return (
        f"seq {s['seq']} {s['op']}[{s['numel']}] {s['dtype']} group={s['group']}/{s['group_size']} origin={s['origin']}"
        + (f" peer={s['peer']}" if s.get("peer") is not None else "")
    )
