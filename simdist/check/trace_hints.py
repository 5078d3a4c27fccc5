"""Hints for a run whose program simdist does not know: read from what the traces show.

The family hints of `simdist.check.hints` read the scenario (input counts, the Join block,
the steps). A job known only from its Flight Recorder dumps has no scenario, but its traces
still say which code issued what (origins from the Python frames): a joined rank's shadow
collectives against a rank still training, a rank in its own code after the loop against a
rank still in DDP's backward, two call sites of the user's code at one sequence number, a
rank that finished while the others wait. Each hint names the family and its fix.
"""

from __future__ import annotations

from simdist.check.classify import Verdict, failing_entry
from simdist.report import Finding, Report, TraceEntry
from simdist.vocab import MISMATCH_KINDS, ORIGINS, USER_ORIGIN_PREFIX

_JOIN = ("join.exit.",)  # Join's own collectives on a joined rank (notify_join_context's are a training rank's)
_SHADOW = ".join_hook."  # a joinable's shadow of its loop collectives
_LEFT = "hint (a rank finished while others wait): "
_BACKWARD = ("ddp.backward.",)  # a training rank's gradient synchronisation
# what a training rank issues once its backward synchronised: the next forward's first
# collectives, or Join's heartbeat (the first joinable's: DDP's forward, or ZeRO's step;
# never an in-progress backward)
_NEXT_FORWARD = ("join.notify_join_context.", "ddp.pre_forward.")
_EARLY_TERMINATION = ("hint (Join raised on early termination): with throw_on_early_termination=True every rank "
                      "raises once one runs out of inputs -- the intended fail-fast, not a deadlock; catch the "
                      "RuntimeError around the loop to stop all ranks together, or drop the flag where every "
                      "collective of the loop is shadowed by a join hook")


def early_termination_hint() -> str:
    """The fix for Join's early-termination error (shared with the scenario hints)."""
    return _EARLY_TERMINATION


def _what(e: TraceEntry) -> str:
    if e.origin.startswith(USER_ORIGIN_PREFIX):
        return f"its own code ({e.origin[len(USER_ORIGIN_PREFIX):]})"
    return ORIGINS.get(e.origin, e.origin)


def _joined(e: TraceEntry) -> bool:
    return e.origin.startswith(_JOIN) or _SHADOW in e.origin


def _in_join(trace: list[TraceEntry], e: TraceEntry) -> bool:
    """`e` was issued by a joined rank: it, or an earlier operation of its rank, is Join's own
    (Join.__exit__'s loop) or a join hook's shadow. Join's heartbeat alone does not say: a
    training rank's first joinable issues it (DDP's forward), and so does a joined rank whose
    ZeRO join hook runs its step."""
    for x in trace:
        if _joined(x):
            return True
        if x is e:
            return False
    return False


def trace_hints(report: Report, verdict: Verdict) -> list[str]:
    """One line per family the traces show, each naming its fix."""
    out: list[str] = []
    index = [{(e.group, e.seq): e for e in r.trace} for r in report.ranks]
    for f in verdict.findings:
        if f.kind in MISMATCH_KINDS:
            line = _mismatch_hint(f, [index[r].get((f.group, f.seq)) for r in f.ranks], f.ranks,
                                  [report.ranks[r].trace for r in f.ranks])
        elif f.kind in ("hang", "peer_exited"):
            line = _left_hint(report, f)
            if line is not None and any(x.startswith(_LEFT) for x in out):
                continue  # one per run: each waiting rank's finding would repeat it
        else:
            line = None
        if line is not None and line not in out:
            out.append(line)
    if any(r.error is not None and r.error.category == "join_early_termination" for r in report.ranks):
        out.append(_EARLY_TERMINATION)
    return out


def _mismatch_hint(f: Finding, entries: list[TraceEntry | None], ranks: list[int],
                   traces: list[list[TraceEntry]]) -> str | None:
    calls = [(r, e, t) for r, e, t in zip(ranks, entries, traces, strict=True) if e is not None]
    joined = [(r, e) for r, e, t in calls if _in_join(t, e)]
    other = [(r, e) for r, e, t in calls if not _in_join(t, e)]
    calls = [(r, e) for r, e, _ in calls]
    if joined and other:
        (a, ea), (b, eb) = joined[0], other[0]
        raw = eb.origin.startswith(USER_ORIGIN_PREFIX)
        return (f"hint (Join's shadow out of step): rank {a} has run out of inputs and shadows in Join ({_what(ea)}) "
                f"while rank {b} issues {_what(eb)} at #{f.seq}; "
                + ("Join never shadows a raw collective: issue it from a Joinable with a join hook, only while all "
                   "ranks have inputs, or pass throw_on_early_termination=True to fail fast" if raw else
                   "the shadow sequence follows the joinables' order: pass every communicating object to Join, the "
                   "model (DDP) first, and keep raw collectives out of the Join block"))
    backward = [(r, e) for r, e in other if e.origin.startswith(_BACKWARD)]
    forward = [(r, e) for r, e in other if e.origin.startswith(_NEXT_FORWARD)]
    if backward and forward:
        (a, ea), (b, eb) = backward[0], forward[0]
        # the traces alone cannot tell which: a backward that synchronised nothing, or a rank with
        # fewer inputs that went on to another forward (an evaluation in train mode) -- name both
        return (f"hint (gradient synchronisation out of step): rank {a} is in {_what(ea)} of its backward while rank "
                f"{b} issues {_what(eb)} at #{f.seq}, which comes after a forward's gradients were synchronised: "
                f"rank {b}'s last backward synchronised nothing (model.no_sync() on iterations that differ across "
                f"ranks, or a skipped backward), or rank {b} ran out of inputs and went on to another forward (an "
                f"evaluation) while rank {a} still trains; decide the synchronising steps and the end of training "
                "from a count all ranks share, not from a rank's own number of batches")
    mine = [(r, e) for r, e in calls if e.origin.startswith(USER_ORIGIN_PREFIX)]
    theirs = [(r, e) for r, e in calls if not e.origin.startswith(USER_ORIGIN_PREFIX)]
    if mine and theirs:
        (a, ea), (b, eb) = mine[0], theirs[0]
        return (f"hint (ranks at different points of the program): rank {a} is in {_what(ea)} while rank {b} is "
                f"still in {_what(eb)} at #{f.seq}: rank {a} left the training loop earlier (fewer inputs, or a "
                "break); give every rank the same number of inputs, decide the stop together (all-reduce a stop "
                "flag), or wrap the loop in Join([...])")
    sites = {e.origin for _, e in mine}
    if len(sites) > 1:
        where = "; ".join(f"rank {r}: {e.op} at {e.origin[len(USER_ORIGIN_PREFIX):]}" for r, e in mine)
        return (f"hint (different collectives at one point): the ranks' own code calls different collectives at "
                f"#{f.seq} on {f.group} ({where}): a call under a condition that differs across ranks pairs with "
                "whatever the others call next; make every member call it, or use a group of just the ranks that "
                "do (dist.new_group)")
    if sites:
        what = f.kind.removesuffix("_mismatch").replace("_", " ")
        return (f"hint (arguments that differ across ranks): the same call ({next(iter(sites))[len(USER_ORIGIN_PREFIX):]}) "
                f"issues a different {what} on different ranks at #{f.seq}: what it sends must agree on every rank "
                "(a size computed from rank-local data: pad it, or all-gather the sizes first)")
    return None


def _left_hint(report: Report, f: Finding) -> str | None:
    """Ranks that finished (or exited) while others wait for them."""
    waiting = [r for r in f.ranks if report.ranks[r].status != "completed"] if f.kind == "peer_exited" else \
        [r.rank for r in report.ranks if r.blocked_in is not None and (r.blocked_in.group, r.blocked_in.seq) ==
         (f.group, f.seq)]
    gone = [r for r in f.ranks if report.ranks[r].status == "completed"]
    if not waiting or not gone:
        return None
    e = failing_entry(report, waiting[0])
    if e is None:
        return None
    joined = any(_joined(x) for r in report.ranks for x in r.trace)
    fix = ("its Join did not shadow this collective: make every communicating object a joinable, and keep raw "
           "collectives out of the Join block" if joined else
           "without Join (or with a disabled one) nothing shadows the collectives of ranks that still have inputs: "
           "wrap the loop in Join([model, ...]), give every rank the same number of inputs "
           "(DistributedSampler with drop_last=True), or decide an early stop together (all-reduce a stop flag)")
    return (f"{_LEFT}rank(s) {gone} got through everything they issued while "
            f"rank {waiting[0]} is in {_what(e)} at #{e.seq}; {fix}")
