"""Whole iterations timed (no real processes): the simulator's iteration with the calibrated
Gloo model equals its closed form when nothing contends, a group's bucket all-reduces queue
behind each other, the comparison table has one row per (iteration, rank), and
`simdist compare --timing` refuses what it cannot time with one line and exit 2."""

from __future__ import annotations

import time
from dataclasses import replace

import pytest

from simdist.network.cost import CostModel
from simdist.network.gloo_time import gloo_op_time
from simdist.network.profile import Profile
from simdist.report import Report, Span
from simdist.scenario import parse_scenario
from simdist.sim import simulate
from simdist.timing.iterations import compare_iterations, has_timed_work, iteration_times, median_abs_error
from tests.test_gloo_time import host

C, B = 0.010, 0.020  # seconds: the compute step, the backward's own compute


def ddp(params: list[int], counts=(4, 4), backward: float | list[float] = B, **model) -> dict:
    return {"name": "it", "world_size": len(counts), "inputs": {"counts": list(counts)},
            "model": {"params": params, **model}, "optimizer": {"kind": "sgd"},
            "loop": [{"kind": "forward"}, {"kind": "compute", "seconds": C},
                     {"kind": "backward", "seconds": backward}, {"kind": "optimizer_step"}]}


def timed(d: dict, h=None) -> Report:
    s = parse_scenario(d)
    prof = Profile(host=h or host())
    return simulate(s, CostModel.from_scenario_topology(s.topology, s.world_size, profile=prof))


def loop(rep: Report, i: int, rank: int = 0) -> float:
    return iteration_times(rep)[(f"loop {i}", rank)]


def test_one_bucket_iteration_is_its_closed_form():
    """One 1 MB parameter, one bucket: the all-reduce starts when the backward's compute
    ends, so an iteration is compute + backward + one all-reduce; the second iteration
    also has the rebuild's two broadcasts (int32: 2 and 1 elements) in its forward."""
    h = host()
    rep = timed(ddp([250_000]), h)
    ar = gloo_op_time(h, "all_reduce", 1_000_000, 2)
    for i in (2, 3):
        for r in (0, 1):
            assert loop(rep, i, r) == pytest.approx(C + B + ar, rel=1e-9)
    rebuild = gloo_op_time(h, "broadcast", 8, 2) + gloo_op_time(h, "broadcast", 4, 2)
    assert loop(rep, 1) == pytest.approx(C + B + ar + rebuild, rel=1e-9)


@pytest.mark.parametrize("backward", [0.006, 0.060])
def test_three_buckets_overlap_the_backward_and_queue(backward):
    """Three 2 MB parameters, a bucket each (cap 1 MiB): bucket k is ready after (k+1)/3 of
    the backward. When an all-reduce (T) outlasts a third of the backward they run back to
    back, one after another on the group: b/3 + 3T; otherwise only the last is exposed: b + T."""
    h = host()
    rep = timed(ddp([500_000] * 3, backward=backward, bucket_cap_mb=1), h)
    t = gloo_op_time(h, "all_reduce", 2_000_000, 2)
    want = C + (backward / 3 + 3 * t if t >= backward / 3 else backward + t)
    assert (t >= backward / 3) == (backward == 0.006)  # one case of each
    assert loop(rep, 3) == pytest.approx(want, rel=1e-9)


def test_join_exit_shadows_the_longer_rank():
    """Uneven inputs under Join: the rank that runs out spends its Join exit shadowing the
    other's remaining iterations, which end when the other rank's do."""
    d = {**ddp([250_000], counts=(2, 4)), "join": {"joinables": ["ddp"]}}
    rep = timed(d)
    r0 = {sp.label: sp for sp in rep.ranks[0].phases}
    r1 = {sp.label: sp for sp in rep.ranks[1].phases}
    assert "join_exit" in r0 and "loop 3" in r1 and "loop 3" not in r0
    assert r0["join_exit"].t_end >= r1["loop 3"].t_end - 1e-12


def test_table_has_a_row_per_iteration_and_rank():
    sim = timed(ddp([1000], counts=(3, 2), backward=[0.02, 0.01]) | {"join": {"joinables": ["ddp"]}})

    def scaled(k: float) -> Report:
        return replace(sim, source="real", ranks=[replace(r, phases=[Span(s.t_begin * k, s.t_end * k, s.label)
                                                                     for s in r.phases]) for r in sim.ranks])

    rows = compare_iterations(sim, [scaled(1.1), scaled(1.3), scaled(0.9), scaled(1.0)])
    assert [(x.label, x.rank) for x in rows] == [("loop 0", 0), ("loop 1", 0), ("loop 2", 0), ("join_exit", 0),
                                                 ("loop 0", 1), ("loop 1", 1), ("join_exit", 1)]
    for x in rows:
        assert len(x.runs) == 4 and x.runs[0] == pytest.approx(1.1 * x.simulated_s)
        assert x.measured_s == pytest.approx(0.975 * x.simulated_s)  # the 25th percentile of 0.9, 1.0, 1.1, 1.3
    assert median_abs_error(rows) == pytest.approx(0.025 / 0.975)


def test_what_counts_as_timed_work():
    assert has_timed_work(parse_scenario(ddp([10])))
    assert has_timed_work(parse_scenario(ddp([10], backward=[0.0, 0.1])))
    d = ddp([10], backward=0.0)
    d["loop"] = [st for st in d["loop"] if st["kind"] != "compute"]
    assert not has_timed_work(parse_scenario(d))


def test_backward_seconds_per_rank_must_match_world_size():
    from simdist.errors import ScenarioError

    with pytest.raises(ScenarioError, match=r"loop\[2\]\.seconds: has 3 entries but world_size is 2"):
        parse_scenario(ddp([10], backward=[0.1, 0.1, 0.1]))


def test_real_chain_model_sleeps_its_shares_in_backward():
    """The real backend's side of `backward.seconds`: each parameter's share is slept before
    its gradient, and the gradients are those of the model without it."""
    import torch

    from real_backend.model import ChainModel
    from simdist.schema import Model

    plain, busy = ChainModel(Model(params=[30, 10])), ChainModel(Model(params=[30, 10]), busy=True)
    busy.set_backward_seconds(0.04)
    assert busy._shares == pytest.approx([0.03, 0.01])
    x = torch.ones(1)
    t0 = time.perf_counter()
    busy(x).sum().backward()
    assert time.perf_counter() - t0 >= 0.04
    plain(x).sum().backward()
    for a, b in zip(plain.parameters(), busy.parameters(), strict=True):
        assert torch.equal(a.grad, b.grad)


# --- simdist compare --timing: bad input is one line, exit 2, before any process starts -------------
def _compare(tmp_path, scenario: dict, *args: str, timing: bool = True):
    import tomli_w
    from typer.testing import CliRunner

    from simdist.cli import app

    path = tmp_path / "s.toml"
    path.write_bytes(tomli_w.dumps(scenario).encode())
    return CliRunner().invoke(app, ["compare", str(path), *(["--timing"] if timing else []), *args])


@pytest.mark.parametrize("given", [["--profile", "x.json"], ["--runs", "3"], ["--max-error", "0.2"]])
def test_timing_options_without_timing_are_refused(tmp_path, given):
    """Not silently ignored (a plain compare would run instead): one line naming the option."""
    res = _compare(tmp_path, ddp([10]), *given, timing=False)
    assert res.exit_code == 2 and res.stderr.strip() == f"error: {given[0]}: only with --timing"


def test_timing_needs_a_loop_that_computes(tmp_path):
    d = ddp([10], backward=0.0)
    d["loop"] = [st for st in d["loop"] if st["kind"] != "compute"]
    res = _compare(tmp_path, d, "--profile", "x.json")
    assert res.exit_code == 2 and "loop: --timing needs a loop that computes" in res.stderr
    assert len(res.stderr.strip().splitlines()) == 1


def test_timing_needs_a_profile_with_host_primitives(tmp_path):
    res = _compare(tmp_path, ddp([10]))
    assert res.exit_code == 2 and res.stderr.startswith("error: --profile: --timing needs a calibrated profile")
    res = _compare(tmp_path, ddp([10]), "--profile", str(tmp_path / "missing.json"))
    assert res.exit_code == 2 and "--profile:" in res.stderr and len(res.stderr.strip().splitlines()) == 1
    Profile().save(tmp_path / "fitted-only.json")
    res = _compare(tmp_path, ddp([10]), "--profile", str(tmp_path / "fitted-only.json"))
    assert res.exit_code == 2 and "has no host primitives" in res.stderr


@pytest.mark.parametrize("k, code", [(1.1, 0), (1.5, 1)])
def test_compare_timing_prints_and_judges_the_table(tmp_path, capsys, k, code):
    """The command's path with the real runs stood in for by the simulated report stretched
    by k: one line per (iteration, rank), the median, exit 0 within --max-error, else 1."""
    import json

    import typer

    from simdist.cli.iteration_timing import compare_timing

    s = parse_scenario(ddp([1000], counts=(3, 3)))
    prof = tmp_path / "host.json"
    Profile(host=host()).save(prof)
    sim = timed(ddp([1000], counts=(3, 3)))
    real = replace(sim, source="real", ranks=[replace(r, phases=[Span(x.t_begin * k, x.t_end * k, x.label)
                                                                 for x in r.phases]) for r in sim.ranks])
    for json_ in (False, True):
        with pytest.raises(typer.Exit) as e:
            compare_timing(s, prof, 2, lambda: real, json_, 0.15)
        assert e.value.exit_code == code
        text = capsys.readouterr().out
        if json_:
            doc = json.loads(text)
            assert [(r["label"], r["rank"]) for r in doc["rows"]] == [(f"loop {i}", r) for r in (0, 1) for i in range(3)]
            assert doc["median_abs_error"] == pytest.approx(1 - 1 / k) and doc["runs"] == 2
        else:
            lines = text.strip().splitlines()
            assert lines[0].split() == ["iteration", "rank", "measured", "ms", "simulated", "ms", "error"]
            assert len(lines) == 1 + 6 + 1 and lines[-1].startswith("median |error| over 6 (iteration, rank): ")
            assert lines[1].split()[:3] == ["loop", "0", "0"] and lines[1].endswith(f"{(1 / k - 1) * 100:+.1f}%")
