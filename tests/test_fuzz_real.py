"""Issue #5 acceptance, end to end: for each deadlock family the fuzzer finds a failure within
200 examples, shrinks it to 2 ranks, writes a plain scenario that replays with `simdist run`,
and that scenario gives the same verdict on real Gloo (`simdist compare` agrees)."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.scenario import load_scenario
from simdist.sim import simulate

from .conftest import SCENARIOS, run_cli

FAMILIES = ["no_join", "join_disabled", "unshadowed_every_k", "subset_collective", "forward_collective",
            "zero_before_ddp", "no_sync"]


@pytest.mark.real
@pytest.mark.parametrize("family", FAMILIES)
def test_family_counterexample_replays_in_sim_and_on_real_gloo(family, tmp_path, real_zygote):
    from real_backend.launch import run_real

    out = tmp_path / "failures"
    res = run_cli("fuzz", str(SCENARIOS / "templates" / f"{family}.toml"), "--budget", "200", "--seed", "0",
                  "--out", str(out), "--no-db", "--quiet", timeout=300)
    # 0: the search ended as the family template's [fuzz].expect = "failure" says (a failure was found)
    assert res.returncode == 0 and "failure found" in res.stdout, res.stdout + res.stderr
    written = sorted(out.glob("*.toml"))
    assert written, res.stdout
    path = written[0]
    s = load_scenario(path)
    assert s.world_size == 2  # shrunk to the fewest ranks that still fail
    replay = run_cli("run", str(path))
    assert replay.returncode == 0, replay.stdout  # its [expect] holds the failing verdict
    sim = simulate(s)
    assert sim.outcome != "completed" or sim.findings
    cmp = compare_reports(sim, run_real(s, zygote=real_zygote))
    assert cmp.agree, format_comparison(cmp)
