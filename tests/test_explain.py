"""`simdist explain`: formula with numbers, steps, time split, crossovers, timeline."""

from __future__ import annotations

import json
from pathlib import Path

import typer
from typer.testing import CliRunner

from simdist.cli.timing import app, register
from simdist.timing.explain import Alternative, Explanation, Step, explain

runner = CliRunner()
DOCS = Path(__file__).resolve().parent.parent / "docs"


def _mounted() -> typer.Typer:
    main = typer.Typer()

    @main.command("run")
    def _run() -> None:  # another command, as in the real CLI
        pass

    register(main)
    return main


def test_explain_ring_all_reduce_top_level():
    r = runner.invoke(_mounted(), ["explain", "all_reduce", "--algo", "ring", "--ranks", "4", "--bytes", "1048576"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "all_reduce / ring on p = 4 ranks, n = 1048576 B" in out
    assert "T = 2(p-1)·α + 2(p-1)/p·n·β + (p-1)/p·n·γ" in out  # the formula
    assert "for p = 4: T = 6·α + 1.5·n·β + 0.75·n·γ" in out  # with p filled in
    assert "6·30.00 us + 1.5·1048576 B" in out  # with the numbers filled in
    assert "Where the time goes:" in out and "latency" in out and "bandwidth" in out and "reduction" in out
    assert "reduce-scatter" in out and "all-gather" in out  # step table phases
    assert out.count("262144") >= 6  # each of the 6 steps moves n/p bytes per message
    assert "crossover at" in out  # against tree / recursive doubling
    assert "rank   0 |" in out and "rank   3 |" in out  # the timeline
    assert "busbw" in out


def test_explain_numbers_are_consistent():
    info = explain("all_reduce", "ring", 4, 1 << 20)
    assert isinstance(info, Explanation) and all(isinstance(s, Step) for s in info.steps)
    split = info.breakdown_s
    assert abs(info.time_s - (split.latency + split.bandwidth + split.reduction)) < 1e-15
    assert abs(info.simulated_s - info.time_s) < 1e-12
    assert len(info.steps) == 6 and abs(info.steps[-1].end_s - info.time_s) < 1e-12
    assert info.bytes_on_wire == 2 * 3 * (1 << 20)
    # the timeline data: every transfer of the simulation, ending when the collective does
    assert len(info.simulation.transfers) == info.messages
    assert max(t.end for t in info.simulation.transfers) == info.simulation.finish
    # the crossover really is where the faster algorithm changes
    from simdist.collectives import REGISTRY

    assert isinstance(info.others["recursive_doubling"], Alternative)
    cx = info.others["recursive_doubling"].crossover_bytes
    a, b, g = info.alpha_s, info.beta_s_per_byte, info.gamma_s_per_byte
    ring, rd = REGISTRY[("all_reduce", "ring")], REGISTRY[("all_reduce", "recursive_doubling")]
    assert ring.time(4, cx * 0.9, a, b, g) > rd.time(4, cx * 0.9, a, b, g)
    assert ring.time(4, cx * 1.1, a, b, g) < rd.time(4, cx * 1.1, a, b, g)


def test_explain_json_and_trace(tmp_path):
    trace = tmp_path / "t.json"
    r = runner.invoke(
        app,
        [
            "explain",
            "reduce_scatter",
            "--algo",
            "recursive_halving",
            "--ranks",
            "6",
            "--bytes",
            "6M",
            "--json",
            "--trace",
            str(trace),
        ],
    )
    assert r.exit_code == 0, r.output
    d = json.loads(r.output)
    assert d["algo"] == "recursive_halving" and d["ranks"] == 6 and d["nbytes"] == 6 << 20
    assert {"formula", "steps", "breakdown_s", "others", "timeline", "coefficients"} <= set(d)
    tr = json.loads(trace.read_text())
    sends = [e for e in tr["traceEvents"] if e["ph"] == "b" and e["name"].startswith("send")]
    assert len(sends) == sum(s["messages"] for s in d["steps"])  # every message, on its sender
    assert {e["pid"] - 1 for e in sends} == set(range(6))


def test_explain_auto_and_overrides():
    info = explain("all_reduce", "auto", 16, 8, alpha_us=100, bandwidth_gbps=1, gamma_gbps=10)
    assert info.algo == "recursive_doubling"
    info = explain("all_reduce", "auto", 16, 256 << 20, alpha_us=100, bandwidth_gbps=1, gamma_gbps=10)
    assert info.algo in ("ring", "rabenseifner")
    assert info.breakdown_s.bandwidth > info.breakdown_s.latency


def test_explain_every_op():
    for op in ("broadcast", "reduce", "all_gather", "all_to_all", "gather", "scatter", "barrier"):
        r = runner.invoke(app, ["explain", op, "--ranks", "5", "--bytes", "40K"])
        assert r.exit_code == 0, (op, r.output)
        assert f"{op} / " in r.output and "Steps (" in r.output


def test_explain_bad_input_is_one_line():
    cases = [
        (["explain", "allreduce"], "unknown collective 'allreduce'"),
        (["explain", "all_reduce", "--algo", "magic"], "algo: unknown algorithm 'magic'"),
        (["explain", "all_reduce", "--ranks", "0"], "ranks:"),
        (["explain", "all_reduce", "--bytes", "12 parsecs"], "bytes: cannot read size"),
        (["explain", "all_reduce", "--preset", "moon"], "unknown preset 'moon'"),
        (["explain", "all_reduce", "--preset", "ring", "--ranks", "5"], "preset: 'ring' is not uniform"),
    ]
    for args, msg in cases:
        r = runner.invoke(app, args)
        assert r.exit_code == 2, (args, r.output)
        lines = r.output.strip().splitlines()
        assert len(lines) == 1 and msg in lines[0] and "Traceback" not in r.output, (args, r.output)


def test_docs_walkthrough_and_example_plot():
    text = (DOCS / "cost-model.md").read_text()
    for needle in ("T_comm", "2(p-1)/p", "busbw", "simdist explain", "compare-timing"):
        assert needle in text
    imgs = sorted((DOCS / "img").glob("*.png"))
    assert imgs, "docs/img has the example plots"
    for img in imgs:
        assert img.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert f"img/{img.name}" in text
