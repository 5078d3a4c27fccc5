"""Hints: the known family a failed run belongs to, and the fix that fits that family.

The fixes differ, so naming the family matters: Join is the fix for uneven inputs, not for
a rank that breaks out of its loop on a condition (Join would let the others go on training
without it); throw_on_early_termination is a fix for a hang, not for the error it raises.

| family | recognised by | fix named |
|---|---|---|
| early break | a rank left its loop with inputs left | decide together: all-reduce a stop flag every iteration |
| uneven inputs, no Join | input counts differ, no Join | Join([...]) with every joinable; for raw collectives, an all-reduced "has data" flag or equal inputs |
| disabled Join | Join(enable=False), counts differ | enable it |
| ZeRO before DDP | zero listed before ddp | list the model first |
| DDP not joinable | DDP in the loop, not in Join's joinables | add it |
| collective on a subset | a step's `ranks` is not its group | issue it on every member, or on a group of those ranks |
| forward-pass collective | a raw collective between forward and backward under Join | Join cannot shadow it: equal inputs, or fail fast |
| unshadowed collective | a raw collective in the loop under Join | a join hook that shadows it, fail fast, or only while all ranks have inputs |
| early termination raised | throw_on_early_termination and Join's error | the intended fail-fast: stop all ranks on it, or drop it once all is shadowed |
| no_sync boundaries | no_sync forwards in a failed run | sync on a step count all ranks share |
"""

from __future__ import annotations

from simdist.check.classify import Verdict, failing_entry
from simdist.check.trace_hints import early_termination_hint, trace_hints
from simdist.report import Report
from simdist.scenario import CollectiveStep, ForwardStep, Scenario

COMM_KINDS = ("forward", "backward", "optimizer_step", "collective", "joinable_call", "p2p")
RAW_KINDS = ("collective", "p2p")  # collectives the user issues: no join hook shadows them


def joined(scenario: Scenario) -> bool:
    """Is the loop inside an enabled Join?"""
    return scenario.join is not None and scenario.join.enabled


def step_of(scenario: Scenario, origin: str) -> tuple[str, int] | None:
    """(section, index) of the scenario step that issued a ``user.`` collective."""
    if not origin.startswith("user."):
        return None
    label = origin[5:]
    for section in ("loop", "after"):
        for k, st in enumerate(getattr(scenario, section)):
            if label == f"{section}[{k}]" or getattr(st, "name", None) == label:
                return section, k
    return None


def early_breakers(report: Report, scenario: Scenario) -> list[tuple[int, int, int]]:
    """(rank, inputs processed, inputs given) of ranks that finished their loop with inputs
    left: they broke out of it (a `stop` step, a condition), they did not run out of data."""
    counts = scenario.counts()
    if all(r.status == "completed" for r in report.ranks) and len({r.inputs_processed for r in report.ranks}) == 1:
        return []  # every rank left at the same input and finished: a stop decided together (an all-reduced flag)
    return [(r.rank, r.inputs_processed, counts[r.rank]) for r in report.ranks
            if r.status == "completed" and r.rank < len(counts) and r.inputs_processed < counts[r.rank]]


def hints(report: Report, scenario: Scenario, verdict: Verdict) -> list[str]:
    """One line per family the failed run matches, each naming the fix for that family. A
    scenario without steps knows nothing of the program (a job known from its Flight Recorder
    dumps): then the traces tell the family (`simdist.check.trace_hints`)."""
    if not scenario.loop and not scenario.after:
        return trace_hints(report, verdict)
    out = _loop_hints(report, scenario, verdict)
    out += _step_hints(report, scenario, verdict)
    return out


def _loop_hints(report: Report, scenario: Scenario, verdict: Verdict) -> list[str]:
    out: list[str] = []
    counts = scenario.counts()
    j = scenario.join
    kinds = {s.kind for s in scenario.loop}
    breakers = early_breakers(report, scenario)
    for rank, done, given in breakers:
        out.append(f"hint (a rank left its loop early): rank {rank} stopped after {done} of its {given} inputs (a "
                   "break on a condition) while the others go on issuing the loop's collectives and wait for it. "
                   "Join is not the fix (it would let the others train on without this rank): decide the stop "
                   "together -- all-reduce a stop flag (ReduceOp.MAX) every iteration and break on every rank when "
                   "it is set")
    uneven = len(set(counts)) > 1 and bool(kinds & set(COMM_KINDS))
    if uneven and j is None:
        raw = sorted(kinds & set(RAW_KINDS))
        if kinds - set(RAW_KINDS) & set(COMM_KINDS):
            out.append("hint (uneven inputs, no Join): a rank that runs out of inputs stops issuing collectives "
                       "while ranks with more inputs wait for it; wrap the loop in Join([...]) with every joinable "
                       "that communicates (the DDP model, a ZeroRedundancyOptimizer, Join-aware objects)"
                       + (f"; its raw {'/'.join(raw)} steps are not joinables, see below" if raw else ""))
        if raw:
            out.append(f"hint (uneven inputs, raw {'/'.join(raw)}): Join shadows only its joinables' collectives, "
                       "never a raw one: all-reduce a 'has data' flag (ReduceOp.MIN) every iteration and leave the "
                       "loop on every rank when one is out of inputs, or give every rank the same number of inputs "
                       "(DistributedSampler with drop_last=True)")
    elif uneven and j is not None and not j.enabled:
        out.append("hint (Join(enable=False)): a disabled Join is no Join at all -- nothing shadows the collectives "
                   "of ranks that still have inputs; construct it with enable=True")
    models = [n for n in (j.joinables if j is not None else []) if n in {m.name for m in scenario.all_models()}]
    if j is not None and j.enabled and "zero" in j.joinables and models \
            and j.joinables.index("zero") < j.joinables.index(models[0]):
        out.append("hint (ZeRO listed before DDP): ZeRO is the first joinable, so the Join heartbeat moves into "
                   "optimizer.step() and the joined rank's shadow sequence no longer lines up with DDP's forward; "
                   "list the model before the optimizer in Join's joinables")
    if j is not None and j.enabled and any(m.name not in j.joinables for m in scenario.all_models()) \
            and kinds & {"forward", "backward"}:
        out.append("hint (DDP not a joinable): the loop runs DDP but the model is not one of Join's joinables, so "
                   "DDP's collectives are never shadowed; pass the model to Join([model, ...])")
    if j is not None and j.enabled and j.throw_on_early_termination and any(
            r.error is not None and r.error.category == "join_early_termination" for r in report.ranks):
        out.append(early_termination_hint())
    if verdict.failed and any(isinstance(s, ForwardStep) and s.no_sync for s in scenario.loop):
        out.append("hint (no_sync interplay): some forwards run under model.no_sync(); when ranks disagree on which "
                   "iterations synchronise (conditions on ranks or on per-rank input indices), their gradient "
                   "all-reduces stop pairing; decide the sync steps from a count all ranks share (the global step)")
    return out


def _failing_origins(report: Report, scenario: Scenario, verdict: Verdict) -> list[str]:
    """The user collectives involved in the failure, or issued in the loop under Join."""
    origins: set[str] = set()
    for f in verdict.findings:
        for r in f.ranks:
            if 0 <= r < len(report.ranks):
                e = failing_entry(report, r)
                if e is not None:
                    origins.add(e.origin)
    if joined(scenario):
        origins |= {e.origin for r in report.ranks for e in r.trace if e.origin.startswith("user.") and e.phase == "loop"}
    return sorted(origins)


def _step_hints(report: Report, scenario: Scenario, verdict: Verdict) -> list[str]:
    out: list[str] = []
    uneven = len(set(scenario.counts())) > 1
    throws = scenario.join is not None and scenario.join.throw_on_early_termination
    seen: set[tuple[str, int]] = set()
    for origin in _failing_origins(report, scenario, verdict):
        loc = step_of(scenario, origin)
        if loc is None or loc in seen:
            continue
        seen.add(loc)
        section, k = loc
        st = getattr(scenario, section)[k]
        label = f"{section}[{k}]" + (f" ('{st.name}')" if getattr(st, "name", None) else "")
        if isinstance(st, CollectiveStep) and st.ranks is not None and set(st.ranks) != set(scenario.group_ranks(st.group)):
            members = scenario.group_ranks(st.group)
            out.append(f"hint (collective on a subset of ranks): {label} runs only on ranks {st.ranks} but is a "
                       f"{st.op} on group {st.group} (ranks {members}): the other members pair it with their next "
                       "collective; issue it on every member of the group, or on a group of just those ranks "
                       "(dist.new_group)")
        elif section == "loop" and joined(scenario) and uneven:
            out.append(_shadow_hint(scenario, k, label, st, throws))
    return out


def _shadow_hint(scenario: Scenario, k: int, label: str, st, throws: bool) -> str:
    """A raw collective in the Join block: no join hook shadows it."""
    fwd = [i for i, s in enumerate(scenario.loop) if isinstance(s, ForwardStep)]
    bwd = [i for i, s in enumerate(scenario.loop) if s.kind == "backward"]
    if fwd and bwd and fwd[0] < k < bwd[-1]:
        fix = ("give every rank the same number of inputs (DistributedSampler with drop_last=True)" if throws else
               "give every rank the same number of inputs (DistributedSampler with drop_last=True), or pass "
               "throw_on_early_termination=True to fail fast instead of hanging")
        return (f"hint (forward-pass collective): {label} is a raw collective between forward and backward (like "
                "SyncBatchNorm's statistics all-reduce); no join hook shadows it, so after a rank joins the others "
                f"pair it with a shadow collective -- Join cannot make this work: {fix}")
    cond = f" every {st.every} inputs" if getattr(st, "every", None) else ""
    return (f"hint (unshadowed collective): {label} is a raw collective issued{cond} inside the Join block; no join "
            "hook shadows it, so once a rank has joined the others' sequences drift; issue it from a Joinable whose "
            "join hook shadows it (as torch's Join tutorial Counter does), issue it only while all ranks have inputs, "
            + ("or keep throw_on_early_termination to fail fast" if throws else
               "or pass throw_on_early_termination=True to fail fast"))
