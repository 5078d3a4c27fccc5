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
    assert "crossover" in out and " B)" in out  # against tree / recursive doubling: "at 117 KiB (120000 B)"
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
        (["explain", "allreduce"], "op: unknown collective 'allreduce'"),
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


# --- the formula shown is the formula evaluated, for any p (issue 12) -----------------------------
def _evaluate(text: str, p: int) -> float:
    """A coefficient text of `Algorithm.terms_for` evaluated at p (our own strings, not user input)."""
    import math
    import re

    import simdist.collectives.generators as g

    q = 1 << (p.bit_length() - 1)  # p'
    r = p - q
    minsum = sum(min(d, p - d) for d in g.distances(p))
    foldsum = sum(d + min(r, d) for d in g.distances(q))
    py = (text.replace("Σ min(d, p-d)", "minsum").replace("Σ (d + min(r, d))", "foldsum")
          .replace("⌈lg p⌉", "clg").replace("lg p'", "lgq").replace("lg p", "lgp").replace("p'", "q").replace("·", "*"))
    py = re.sub(r"(\d)\s*(\(|[a-z])", r"\1*\2", py)
    env = {"p": p, "q": q, "r": r, "minsum": minsum, "foldsum": foldsum, "clg": math.ceil(math.log2(p)) if p > 1 else 0,
           "lgq": math.log2(q), "lgp": math.log2(p)}
    return float(eval(py, {"__builtins__": {}}, env))  # noqa: S307 - the registry's own formula texts


def test_every_formula_text_is_what_the_coefficients_evaluate():
    from simdist.collectives.algorithms import REGISTRY

    for (op, name), a in REGISTRY.items():
        for p in range(max(a.min_p, 1), 70):
            terms, note = a.terms_for(p)
            want = a.coeffs(p)
            got = tuple(_evaluate(t, p) for t in terms)
            assert all(abs(x - y) < 1e-9 for x, y in zip(got, want, strict=True)), (op, name, p, terms, want)
            assert bool(note) == (a.any_p is not None and p & (p - 1) != 0)


def test_rabenseifner_on_six_ranks_shows_the_folded_formula():
    r = runner.invoke(app, ["explain", "all_reduce", "--algo", "rabenseifner", "--ranks", "6", "--bytes", "1M"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "(p a power of two)" not in out
    assert "p = 6 is not a power of two" in out and "fold-in" in out and "fold-out" in out
    assert "T = (2·lg p' + 2)·α + (2(p'-1)/p' + 2)·n·β + ((p'-1)/p' + 1)·n·γ" in out
    assert "p' = 4, r = 2" in out
    assert "for p = 6: T = 6·α + 3.5·n·β + 1.75·n·γ" in out  # the coefficients of that formula at p' = 4
    info = explain("all_reduce", "rabenseifner", 6, 1 << 20)
    c = info.coefficients
    assert (c.alpha, c.beta_per_byte, c.gamma_per_byte) == (6, 3.5, 1.75)
    assert abs(info.time_s - (6 * info.alpha_s + (1 << 20) * (3.5 * info.beta_s_per_byte + 1.75 * info.gamma_s_per_byte))) < 1e-15


def test_algbw_and_busbw_with_the_bus_factor():
    info = explain("all_reduce", "ring", 4, 1 << 20)
    assert abs(info.algbw_gbps - (1 << 20) / info.time_s / 1e9) < 1e-12
    assert info.bus_factor == 1.5 and abs(info.busbw_gbps - info.algbw_gbps * 1.5) < 1e-12
    r = runner.invoke(app, ["explain", "all_reduce", "--algo", "ring", "--ranks", "4", "--bytes", "1M"])
    assert "algbw = S / t" in r.output and "busbw = algbw · 2(p-1)/p" in r.output and "= algbw · 1.5" in r.output
    ag = explain("all_gather", "ring", 4, 1 << 20)
    assert abs(ag.algbw_gbps - 4 * (1 << 20) / ag.time_s / 1e9) < 1e-12 and ag.bus_factor == 0.75


def test_sweep_prints_nccl_tests_columns():
    r = runner.invoke(app, ["explain", "all_reduce", "--algo", "ring", "--ranks", "4", "--sweep", "-b", "1K", "-e", "8K"])
    assert r.exit_code == 0, r.output
    lines = r.output.splitlines()
    head = next(i for i, line in enumerate(lines) if "size" in line and "busbw" in line)
    cols = lines[head].split()
    assert cols[:4] == ["size", "count", "type", "redop"] and "time" in cols and cols.index("algbw") < cols.index("busbw")
    rows = [line.split() for line in lines[head + 1:] if line.strip() and line.split()[0].isdigit()]
    assert [int(x[0]) for x in rows] == [1024, 2048, 4096, 8192]
    for x in rows:
        size, count, typ, redop = int(x[0]), int(x[1]), x[2], x[3]
        t_us, algbw, busbw = float(x[4]), float(x[5]), float(x[6])
        assert count == size // 4 and typ == "float" and redop == "sum"
        info = explain("all_reduce", "ring", 4, size)
        assert abs(t_us - info.time_s * 1e6) < 0.01 * t_us
        assert abs(algbw - size / info.time_s / 1e9) <= 0.001 + 1e-3 * algbw
        assert abs(busbw - algbw * 1.5) <= 0.002 + 1e-3 * busbw
    r = runner.invoke(app, ["explain", "all_gather", "--ranks", "4", "--sweep", "-b", "1K", "-e", "2K", "--json"])
    rows = json.loads(r.output)["sweep"]
    assert [row["size"] for row in rows] == [4096, 8192] and rows[0]["redop"] == "none"  # S = p·n, nccl-tests' size


# --- explain at any world size (issue 14) --------------------------------------------------------
def test_explain_at_1024_ranks_summarises_steps_and_keeps_the_timeline_readable():
    r = runner.invoke(app, ["explain", "all_reduce", "--algo", "ring", "--ranks", "1024", "--bytes", "1M"])
    assert r.exit_code == 0, r.output
    out = r.output
    assert "Steps (2046 steps, 2095104 messages" in out and "a typical step of each run of like steps" in out
    table = out[out.index("Steps ("):out.index("Other algorithms")].splitlines()
    rows = [line for line in table[2:] if line.strip()]
    assert len(rows) == 10  # 4 first, a typical reduce-scatter and all-gather step, 4 last
    assert rows[0].startswith("0 ") and rows[-1].startswith("2045 ")
    assert "4..1022" in rows[4] and "reduce-scatter (1019 steps; a typical one)" in rows[4]
    assert "1023..2041" in rows[5] and "all-gather (1019 steps; a typical one)" in rows[5]
    timeline = out[out.index("Timeline ("):].splitlines()
    lanes = [line for line in timeline if "|" in line]
    assert len(lanes) == 13 and "1012 more ranks" in lanes[8]  # 8 first ranks, a gap, 4 last
    assert len({len(line) for line in lanes}) == 1  # aligned, rank 1023 included
    assert set(lanes[0].split("|")[1]) == {"r", "a"} and "marks: r = reduce-scatter, a = all-gather" in out
    info = explain("all_reduce", "ring", 1024, 1 << 20)
    assert abs(info.simulated_s - info.time_s) < 1e-9 * info.time_s
    assert sum(g.count for g in info.step_groups) == len(info.steps) == 2046
    assert [(g.first, g.last) for g in info.step_groups] == [(0, 1022), (1023, 2045)]


def test_explain_short_schedules_show_every_step():
    info = explain("all_reduce", "rabenseifner", 6, 1 << 20)
    assert len(info.step_groups) <= len(info.steps) <= 24
    r = runner.invoke(app, ["explain", "all_reduce", "--algo", "rabenseifner", "--ranks", "6", "--bytes", "1M"])
    assert "typical" not in r.output and "more ranks" not in r.output
    for st in info.steps:
        assert any(line.startswith(f"{st.step} ") for line in r.output.splitlines())
