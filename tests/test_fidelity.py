"""Fidelity: every bundled scenario that fits this machine (Gloo, world size <= 4) runs in the
simulator and on real torch.distributed processes, and the two reports must agree: per-rank
collective sequences (op, numel, dtype, group, origin), statuses, inputs processed, error
categories and Join/model error texts, observed values, and the collective a hung rank is
blocked in. A difference is a bug in the model; never loosen this test to make it pass."""

from __future__ import annotations

import re

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.expect import check_expectations
from simdist.scenario import load_scenario
from simdist.sim import simulate
from simdist.vocab import is_declared_origin

from .conftest import SCENARIOS, descendants


def _leftover(workdir, zygote) -> list[int]:
    """PIDs of live processes of this run: whose command line mentions its work directory
    (a launched worker's), or that the session's fork server forked (a forked worker)."""
    import os

    pids = descendants(zygote.pid)
    for d in os.listdir("/proc"):
        if d.isdigit():
            try:
                with open(f"/proc/{d}/cmdline", "rb") as f:
                    if str(workdir).encode() in f.read():
                        pids.append(int(d))
            except OSError:
                pass
    return pids


FITS = [p for p in sorted(SCENARIOS.glob("*.toml")) if load_scenario(p).world_size <= 4]


@pytest.mark.real
@pytest.mark.parametrize("path", FITS, ids=lambda p: p.stem)
def test_simulator_agrees_with_real_gloo(path, tmp_path, capsys, real_zygote):
    from real_backend.launch import run_real

    s = load_scenario(path)
    sim = simulate(s)
    real = run_real(s, workdir=tmp_path / "wd", zygote=real_zygote)
    assert _leftover(tmp_path / "wd", real_zygote) == [], "a rank process outlived the run"
    cmp = compare_reports(sim, real)
    assert cmp.agree, format_comparison(cmp)
    undeclared = {e.origin for r in real.ranks for e in r.trace if not is_declared_origin(e.origin)}
    assert not undeclared, f"the real recorder emitted origins simdist.vocab does not declare: {undeclared}"
    # the real run also meets the scenario's own expectations
    assert check_expectations(real, s.expect) == []
    _cli_prints_and_exits_0(real, s, capsys)


def _cli_prints_and_exits_0(real, s, capsys) -> None:
    """What `simdist real PATH` prints and returns, from this real report: Gloo's error texts
    (`[/__w/.../pair.cc:553]`) once crashed the report table as Rich markup (issue 16)."""
    import typer

    from simdist.cli.scenario import report_and_exit

    capsys.readouterr()
    with pytest.raises(typer.Exit) as exited:
        report_and_exit(real, s, json_=False)
    out = capsys.readouterr().out
    assert exited.value.exit_code == 0, out
    assert f"{s.name} (real)" in out and "all expectations met" in out
    for r in real.ranks:
        if r.error is not None:  # the table folds long cells over lines
            assert re.sub(r"[\s│]", "", r.error.message) in re.sub(r"[\s│]", "", out)


@pytest.mark.real
@pytest.mark.parametrize("k", range(4))
def test_random_scenario_agrees_with_real_gloo(k, tmp_path, real_zygote):
    """A few of the fidelity sweep's random scenarios (fixed seed); bench/fidelity_sweep.py runs many."""
    import random

    from real_backend.launch import run_real
    from simdist.scenario import parse_scenario
    from simdist.testing.fidelity import random_scenario

    rng = random.Random(1000)
    for _ in range(k + 1):
        d = random_scenario(rng, f"ci_random_{k}")
    s = parse_scenario(d)
    cmp = compare_reports(simulate(s), run_real(s, workdir=tmp_path / "wd", zygote=real_zygote))
    assert cmp.agree, format_comparison(cmp)
    assert _leftover(tmp_path / "wd", real_zygote) == []


@pytest.mark.real
def test_backward_seconds_are_spent_on_real_gloo(tmp_path, real_zygote):
    """A `backward` with `seconds`: real Gloo issues the collectives the simulator does (the
    buckets launched while the backward computes change no order), and every real iteration
    lasts at least the compute the scenario gives it, as the simulated one does."""
    from real_backend.launch import run_real
    from simdist.timing.iterations import iteration_times

    s = load_scenario(SCENARIOS / "ddp_backward_compute.toml")
    sim, real = simulate(s), run_real(s, workdir=tmp_path / "wd", zygote=real_zygote)
    cmp = compare_reports(sim, real)
    assert cmp.agree, format_comparison(cmp)
    want = {(f"loop {i}", r) for i in range(3) for r in range(2)}
    for rep in (sim, real):
        times = iteration_times(rep)
        assert set(times) == want and all(t >= 0.005 + 0.015 for t in times.values()), times
