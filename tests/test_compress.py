"""Schedule compression (simdist.fuzz.compress) is sound: the compressed schedule's verdict is the full one's.

The property: for random scenarios (the bundled templates with up to 8 ranks and up to 60
inputs, and hand-built loops mixing every/below/from_iteration/ranks conditions, no_sync,
unshadowed and subgroup collectives, ZeRO-first joins, enable=False and
throw_on_early_termination), simulating the compressed scenario gives the same outcome,
per-rank status and error category, the same failure kind, signature and finding kinds,
and per-rank inputs_processed equal to the full run's once the removed iterations are added
back, wherever the compressed verdict may stand for the full one (`untrusted` is "").
SIMDIST_COMPRESS_EXAMPLES=N runs N random examples per property (default: 200, derandomized).
"""

from __future__ import annotations

import copy
import os
from typing import Any

import pytest
import tomllib
from hypothesis import HealthCheck, assume, given, settings
from hypothesis import strategies as st

from simdist.check.classify import check_run
from simdist.errors import ScenarioError
from simdist.fuzz.compress import apply, compress, misaligned, plan, untrusted
from simdist.fuzz.runner import fuzz_template
from simdist.fuzz.strategies import template_scenarios
from simdist.fuzz.template import parse_template
from simdist.report import Report
from simdist.scenario import Scenario, parse_scenario
from simdist.sim import simulate
from tests.conftest import ROOT

TEMPLATES = sorted((ROOT / "scenarios" / "templates").glob("*.toml"))
EXAMPLES = int(os.environ.get("SIMDIST_COMPRESS_EXAMPLES", "0"))
MAX_COUNT = 60


def verdict(s: Scenario, rep: Report | None = None) -> dict[str, Any]:
    rep = simulate(s) if rep is None else rep
    v = check_run(rep, s)
    return {
        "outcome": rep.outcome,
        "status": [r.status for r in rep.ranks],
        "errors": [r.error.category if r.error is not None else None for r in rep.ranks],
        "failed": v.failed,
        "kind": v.kind,
        "signature": v.signature,
        "any_finding": bool(v.findings),
        "first_finding": v.findings[0].kind if v.findings else None,
        "finding_kinds": sorted({f.kind for f in v.findings}),
        "inputs_processed": [r.inputs_processed for r in rep.ranks],
    }


STATS: dict[str, int] = {}


def assert_same_verdict(s: Scenario) -> str:
    """Compare the full and compressed verdicts wherever the compressed one is trusted."""
    p = plan(s)
    if not p.compressed:
        STATS["not compressed"] = STATS.get("not compressed", 0) + 1
        return "not compressed"
    c = apply(s, p)
    assert c.counts() == list(p.compressed_counts)
    assert [a - b for a, b in zip(s.counts(), c.counts(), strict=True)] == p.removed()
    try:
        rep = simulate(c)
    except Exception as e:  # a simulator bug (not compression's): the full schedule must hit it too
        with pytest.raises(type(e)):
            simulate(s)
        STATS["simulator crash"] = STATS.get("simulator crash", 0) + 1
        return "simulator crash"
    if misaligned(rep):
        STATS["misaligned"] = STATS.get("misaligned", 0) + 1
        return "misaligned"
    if untrusted(p, rep):
        STATS["stopped past a cut"] = STATS.get("stopped past a cut", 0) + 1
        return "stopped past a cut"
    small = verdict(c, rep)
    full = verdict(s)  # raises where the simulator crashes on the full schedule only
    small["inputs_processed"] = [p.full_inputs_processed(n) for n in small["inputs_processed"]]
    assert small == full, (s.model_dump(exclude_defaults=True), p)
    key = "compared (failed)" if full["failed"] else "compared (ok)"
    STATS[key] = STATS.get(key, 0) + 1
    return key


# ------------------------------------------------------------------ strategies
def _widen(body: dict[str, Any]) -> dict[str, Any]:
    """A bundled template with 2-8 ranks (1-8 where it allowed 1) and 0-60 inputs per rank."""
    b = copy.deepcopy(body)
    b.pop("fuzz", None)
    ws = b.get("world_size")
    lo = ws["range"][0] if isinstance(ws, dict) and "range" in ws else 2
    b["world_size"] = {"range": [min(lo, 2), 8]}
    inputs = b["inputs"]
    if "counts" in inputs:
        inputs["counts"] = {"each": {"range": [0, MAX_COUNT]}}
    else:
        inputs["base"] = {"range": [0, MAX_COUNT]}
    return b


WIDE = [parse_template(_widen(tomllib.loads(p.read_text())), source=p.name) for p in TEMPLATES]
wide_scenarios = st.sampled_from(WIDE).flatmap(template_scenarios).map(lambda pair: pair[1])


def _cond(draw: Any, world: int) -> dict[str, Any]:
    c: dict[str, Any] = {}
    if draw(st.integers(0, 2)) == 0:
        c["every"] = draw(st.integers(1, 4))
    if draw(st.integers(0, 5)) == 0:
        c["below"] = draw(st.integers(0, 25))
    if draw(st.integers(0, 5)) == 0:
        c["from_iteration"] = draw(st.integers(0, 25))
    if draw(st.integers(0, 5)) == 0:
        c["ranks"] = sorted(draw(st.lists(st.integers(0, world - 1), min_size=1, max_size=world, unique=True)))
    return c


@st.composite
def hand_built(draw: Any) -> Scenario:
    world = draw(st.integers(2, 8))
    d: dict[str, Any] = {"world_size": world, "on_finish": draw(st.sampled_from(["stay", "exit"])),
                         "inputs": {"counts": draw(st.lists(st.integers(0, MAX_COUNT), min_size=world, max_size=world))}}
    ddp = draw(st.booleans())
    zero = ddp and draw(st.booleans())
    if ddp:
        d["model"] = {"params": draw(st.sampled_from([[[1, 1], [1]], [4, 3, 2], [3, 5]])),
                      "buffers": draw(st.sampled_from([[], [2]])),
                      "bucket_cap_mb": draw(st.sampled_from([25.0, 0.000016])),
                      "find_unused_parameters": draw(st.booleans())}
        d["optimizer"] = {"kind": "sgd", "zero": zero}
    custom = draw(st.sampled_from([[], ["counter"], ["allreducer"], ["counter", "allreducer"]]))
    d["joinables"] = [{"name": n, "kind": n} for n in custom]
    groups = []
    if world >= 3 and draw(st.booleans()):
        groups = [{"name": "sub", "ranks": sorted(draw(st.lists(st.integers(0, world - 1), min_size=2,
                                                                 max_size=world, unique=True)))}]
        d["groups"] = groups
    joinables = (["ddp"] if ddp else []) + (["zero"] if zero else []) + custom
    if joinables and draw(st.integers(0, 4)) > 0:
        order = draw(st.permutations(joinables))
        j: dict[str, Any] = {"joinables": list(order[:draw(st.integers(1, len(order)))]),
                             "enabled": draw(st.integers(0, 4)) > 0,
                             "throw_on_early_termination": draw(st.integers(0, 4)) == 0}
        kw = draw(st.sampled_from([{}, {"divide_by_initial_world_size": False}, {"sync_max_count": True},
                                   {"num_allreduces": 2, "run_post_hooks": True}]))
        j["kwargs"] = kw
        d["join"] = j
    menu = ["compute", "collective"] + (["forward", "forward_nosync", "backward", "optimizer_step"] if ddp else []) \
        + (["call_counter"] if "counter" in custom else []) + (["call_allreducer"] if "allreducer" in custom else [])
    loop = []
    if ddp and draw(st.booleans()):  # the usual training step first, so DDP loops are common
        loop += [{"kind": "forward"}, {"kind": "backward"}] + ([{"kind": "optimizer_step"}] if draw(st.booleans()) else [])
    for _ in range(draw(st.integers(0 if loop else 1, 4))):
        k = draw(st.sampled_from(menu))
        step: dict[str, Any]
        if k == "compute":
            step = {"kind": "compute", "seconds": draw(st.sampled_from([0.0, 0.0005, 0.002]))}
        elif k == "forward_nosync":
            step = {"kind": "forward", "no_sync": True}
        elif k.startswith("call_"):
            step = {"kind": "joinable_call", "joinable": k[5:]}
        elif k == "collective":
            op = draw(st.sampled_from(["all_reduce", "barrier", "broadcast", "all_gather", "all_reduce"]))
            step = {"kind": "collective", "op": op, "numel": draw(st.sampled_from([1, 4, 1000]))}
            if op == "broadcast":
                step["root"] = draw(st.integers(0, world - 1))
            if groups and draw(st.booleans()):
                step["group"] = "sub"
                if op == "broadcast":
                    step["root"] = groups[0]["ranks"][0]
            if draw(st.integers(0, 3)) == 0:
                step["async"] = True
                step["wait"] = draw(st.sampled_from(["now", "end_of_iteration"]))
            step["value"] = draw(st.sampled_from([1.0, "rank"]))
        else:
            step = {"kind": k}
        step.update(_cond(draw, world))
        loop.append(step)
    d["loop"] = loop
    if draw(st.integers(0, 3)) == 0:
        d["after"] = [{"kind": "collective", "op": "barrier"}]
    try:
        return parse_scenario(d)
    except ScenarioError:
        assume(False)
        raise


# ------------------------------------------------------------------ tests
@settings(max_examples=EXAMPLES or 200, derandomize=not EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck), database=None)
@given(wide_scenarios)
def test_compression_sound_on_templates(s):
    assert_same_verdict(s)


@settings(max_examples=EXAMPLES or 200, derandomize=not EXAMPLES, deadline=None,
          suppress_health_check=list(HealthCheck), database=None)
@given(hand_built())
def test_compression_sound_on_hand_built(s):
    assert_same_verdict(s)


BENCH_LIKE = {
    "world_size": 4, "on_finish": "stay", "inputs": {"counts": [0, 17, 40, 41]},
    "model": {"params": [3, 5]}, "optimizer": {"kind": "adam", "zero": True},
    "join": {"joinables": ["ddp", "zero"]},
    "loop": [{"kind": "forward"}, {"kind": "backward"}, {"kind": "optimizer_step"}],
}


def test_plan_removes_the_steady_middle_of_each_gap():
    s = parse_scenario(BENCH_LIKE)
    p = plan(s)
    # P = 1, warm-up W = 2 iterations; gaps [0,17) (a rank with 0 inputs joins at 0, so its
    # first 3P = 3 iterations are kept: its shadow passes push and rebuild DDP's buckets) and [17,40)
    assert p.period == 1 and p.segments == ((3, 14), (18, 22))
    assert list(p.compressed_counts) == [0, 3, 4, 5] and p.removed() == [0, 14, 36, 36]
    c, removed = compress(s)
    assert c.counts() == [0, 3, 4, 5] and removed == [0, 14, 36, 36]
    assert [p.full_inputs_processed(n) for n in (0, 3, 4, 5)] == [0, 17, 40, 41]
    assert_same_verdict(s)


@pytest.mark.parametrize("patch,reason", [
    ({"loop": [{"kind": "collective", "op": "all_reduce", "value": "iteration"}]}, "iteration"),
    ({"loop": [{"kind": "collective", "op": "all_reduce", "every": 5}, {"kind": "compute", "seconds": 0, "every": 7}]},
     "period 35"),
    ({"loop": [{"kind": "p2p", "src": 0, "dst": 1}]}, "p2p"),
    ({"loop": [{"kind": "collective", "op": "all_reduce", "async": True, "wait": "never"}]}, "never waited"),
])
def test_refused(patch, reason):
    s = parse_scenario({**BENCH_LIKE, **patch})
    p = plan(s)
    assert not p.compressed and reason in p.reason
    assert compress(s) == (s, [0, 0, 0, 0])


def test_short_gaps_are_kept():
    s = parse_scenario({**BENCH_LIKE, "inputs": {"counts": [2, 3, 4, 5]}})
    assert not plan(s).compressed and compress(s)[0] is s


def test_misaligned_shadow_is_not_trusted():
    # Join([counter]) but the loop's all-reduce is no counter call: the joined ranks' shadow pass
    # (count + counter hook: two all-reduces) slides against the live rank's one per iteration.
    # Every pair has equal fingerprints, so only the gap's length decides the outcome.
    s = parse_scenario({"world_size": 3, "on_finish": "stay", "inputs": {"counts": [0, 0, 4]},
                        "joinables": [{"name": "counter", "kind": "counter"}], "join": {"joinables": ["counter"]},
                        "loop": [{"kind": "collective", "op": "all_reduce", "async": True}],
                        "after": [{"kind": "collective", "op": "barrier"}]})
    p = plan(s)
    assert p.compressed
    assert p.compressed_counts == (0, 0, 3)
    assert verdict(s)["outcome"] == "completed" and verdict(apply(s, p))["outcome"] == "hang"
    assert misaligned(simulate(apply(s, p)))


@pytest.mark.parametrize("name", ["ok_ddp_zero_join", "unshadowed_every_k"])
def test_fuzzer_search_is_the_same_with_and_without_compression(name):
    # every property evaluation gives the same answer either way, so the same seed makes the
    # same search: same failure classes, same shrunk counterexamples
    t = next(w for w in WIDE if w.source == f"{name}.toml")
    a = fuzz_template(t, budget=40, seed=3, out_dir=None, use_db=False)
    b = fuzz_template(t, budget=40, seed=3, out_dir=None, use_db=False, compress=False)
    assert a.compressed > 0 and b.compressed == 0
    assert a.failures == b.failures and a.classes == b.classes
    assert [(c.key, c.signature, c.scenario) for c in a.counterexamples] == \
        [(c.key, c.signature, c.scenario) for c in b.counterexamples]
    if name == "unshadowed_every_k":
        assert a.failed and a.counterexamples and a.resimulated > 0
