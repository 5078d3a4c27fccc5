"""Issue 16: no input crashes, hangs or exhausts simdist, nothing found is lost.

Every repro of the issue is a case here (the loader, the resource limits, exit codes, the
fuzzer's files, the real backend's timeout, folder and shutdown aborts), plus a hypothesis
property over bench/malformed_inputs.py's generator of malformed inputs. The store on
loopback is tested in test_procs.py and test_real_backend.py.
"""

from __future__ import annotations

import importlib.util
import io
import json
import math
import os
import random
import re
import signal
import subprocess
import sys
import tempfile
import time
import tracemalloc
from dataclasses import asdict
from pathlib import Path

import pytest
import tomllib
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist.errors import InputError, LimitError, ScenarioError, SimdistError
from simdist.fuzz.runner import FuzzInterrupted, fuzz_template
from simdist.fuzz.template import load_template, parse_template
from simdist.limits import check_timeout
from simdist.scenario import load_scenario, parse_scenario
from simdist.sim import simulate

from .conftest import ROOT, SCENARIOS, run_cli

TEMPLATES = SCENARIOS / "templates"
BASE = {"world_size": 2, "inputs": {"counts": [1, 1]}}
ALLREDUCE = {"kind": "collective", "op": "all_reduce"}


def _strict_json(text: str):
    def no(constant: str):
        raise ValueError(f"{constant} is not JSON")

    return json.loads(text, parse_constant=no)


def _one_line_error(res: subprocess.CompletedProcess, code: int = 2) -> str:
    """The CLI failed with `code`, one line on stderr, no traceback; that line."""
    lines = [ln for ln in res.stderr.splitlines() if ln.strip()]
    assert res.returncode == code, (res.returncode, res.stdout[-500:], res.stderr[-2000:])
    assert "Traceback" not in res.stderr and len(lines) == 1, res.stderr
    return lines[0]


# ----------------------------------------------------------------------------- the loader: files
def _scenario_file(tmp_path: Path, data: bytes | str, name: str = "s.toml") -> Path:
    p = tmp_path / name
    p.write_bytes(data if isinstance(data, bytes) else data.encode())
    return p


@pytest.mark.parametrize("data,expect", [
    (b"world_size = 2\nname = \"\xff\xfe\"\n", "is not UTF-8 text (byte 0xff at line 2, offset 23)"),
    ("world_size = 2\nx = " + "[" * 500 + "]" * 500 + "\n", "nested too deeply to parse"),
    ("world_size = " + "9" * 5000 + "\n", "an integer has more than 4,300 digits"),
    ("world_size = 2\nx = " + "[" * 40 + "1" + "]" * 40 + "\n", "x[0][0]...: nested more than 32 levels deep"),
    ("world_size = 2\ntimeout_s = inf\n[inputs]\ncounts = [1, 1]\n", "timeout_s: inf is not a finite number"),
    ("world_size = 2\n[inputs]\ncounts = [1, nan]\n", "inputs.counts[1]: nan is not a finite number"),
    ("world_size = \"2\"\n[inputs]\ncounts = [1, 1]\n", "world_size: Input should be a valid integer, got str '2'"),
    ("world_size = 2\n[inputs]\ncounts = [1, true]\n", "inputs.counts[1]: Input should be a valid integer, got bool"),
    ("world_size = 2\n[inputs]\ncounts = [1, 2.0]\n", "inputs.counts[1]: Input should be a valid integer"),
], ids=["non-utf8", "depth-500", "int-5000-digits", "depth-40", "timeout-inf", "nan", "str-to-int", "true-to-1",
        "float-to-int"])
def test_file_errors_are_one_line_naming_file_and_field(tmp_path, data, expect):
    p = _scenario_file(tmp_path, data)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ") and expect in msg and "\n" not in msg, msg
    line = _one_line_error(run_cli("run", str(p)))
    assert line == f"error: {msg}"


@pytest.mark.parametrize("kind", ["dev-zero", "fifo", "folder", "missing", "symlink-to-zero", "too-big"])
def test_only_regular_files_of_bounded_size_are_read(tmp_path, kind):
    p = tmp_path / "x.toml"
    if kind == "dev-zero":
        p = Path("/dev/zero")
    elif kind == "fifo":
        os.mkfifo(p)
    elif kind == "folder":
        p.mkdir()
    elif kind == "symlink-to-zero":
        p.symlink_to("/dev/zero")
    elif kind == "too-big":  # a 4 MB counts array: rejected before parsing, at once
        p.write_text("world_size = 2\n[inputs]\ncounts = [" + "1, " * 1_400_000 + "1]\n")
    t = time.monotonic()
    with pytest.raises(SimdistError) as ei:
        load_scenario(p)
    assert time.monotonic() - t < 2.0
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ") and "\n" not in msg
    want = {"dev-zero": "not a regular file (a character device)", "fifo": "not a regular file (a FIFO)",
            "folder": "not a regular file (a folder)", "missing": "cannot read scenario file",
            "symlink-to-zero": "not a regular file (a character device)",
            "too-big": "over the limit of 1,048,576 bytes per input file (set SIMDIST_MAX_FILE_BYTES="}[kind]
    assert want in msg, msg


@pytest.mark.parametrize("profile", ["/dev/zero", "FIFO", "MISSING", "NOT_JSON", "NAN", "WRONG_SHAPE"])
def test_profile_paths_are_checked_at_load(tmp_path, profile):
    path = {"FIFO": tmp_path / "fifo.json", "MISSING": tmp_path / "none.json", "NOT_JSON": tmp_path / "p.json",
            "NAN": tmp_path / "nan.json", "WRONG_SHAPE": tmp_path / "shape.json"}.get(profile, Path(profile))
    if profile == "FIFO":
        os.mkfifo(path)
    elif profile == "NOT_JSON":
        path.write_text("{")
    elif profile == "NAN":
        path.write_text('{"entries": [{"op": "all_reduce", "world_size": 2, "piecewise": {"segments": '
                        '[{"lo": 0, "hi": null, "a": NaN, "b": 0}]}}]}')
    elif profile == "WRONG_SHAPE":
        path.write_text('{"entries": [{"op": "all_reduce"}]}')
    d = {**BASE, "topology": {"profile": str(path)}}
    t = time.monotonic()
    with pytest.raises(ScenarioError) as ei:
        parse_scenario(d, source="s.toml")
    assert time.monotonic() - t < 2.0
    msg = str(ei.value)
    assert msg.startswith("s.toml: topology.profile: ") and "\n" not in msg, msg


def test_a_saved_profile_is_valid_json_and_reads_back(tmp_path):
    from simdist.network.profile import OpProfile, PiecewiseFit, Profile, Segment, load_profile

    prof = Profile()
    prof.add(OpProfile("all_reduce", 2, PiecewiseFit([Segment(0, 1e6, 1e-5, 1e-9), Segment(1e6, math.inf, 2e-5, 1e-9)])))
    path = prof.save(tmp_path / "p.json")
    _strict_json(path.read_text())
    back = load_profile(path)
    assert back.predict("all_reduce", 2e6, 2) == pytest.approx(2e-5 + 2e6 * 1e-9)
    # files written before the open end was null still load
    path.write_text(path.read_text().replace('"hi": null', '"hi": Infinity'))
    assert load_profile(path).predict("all_reduce", 2e6, 2) == pytest.approx(2e-5 + 2e6 * 1e-9)


# ----------------------------------------------------------------------------- the loader: values
@pytest.mark.parametrize("patch,expect", [
    ({"model": {"params": [4], "bucket_cap_mb": math.inf}}, "model.bucket_cap_mb: inf is not a finite number"),
    ({"model": {"params": [4], "bucket_cap_mb": 1e300}}, "model.bucket_cap_mb: Input should be less than or equal"),
    ({"loop": [{**ALLREDUCE, "dtype": "int64", "value": math.inf}]}, "loop[0].value: inf is not a finite number"),
    ({"loop": [{**ALLREDUCE, "dtype": "int64", "value": 1e300}]}, "loop[0].value: 1e+300 does not fit int64"),
    ({"loop": [{**ALLREDUCE, "dtype": "uint8", "value": -1.0}]}, "loop[0].value: -1.0 does not fit uint8"),
    ({"loop": [{**ALLREDUCE, "dtype": "float16", "value": 1e10}]}, "loop[0].value: 10000000000.0 does not fit float16"),
    ({"world_size": 200, "inputs": {"base": 1}, "loop": [{**ALLREDUCE, "dtype": "int8", "value": "rank"}]},
     "loop[0].value: rank = 199 does not fit int8"),
    ({"inputs": {"counts": [300, 1]}, "loop": [{**ALLREDUCE, "dtype": "int8", "value": "iteration"}]},
     "loop[0].value: iteration = 299 does not fit int8"),
    ({"joinables": [{"name": "a", "kind": "allreducer"}], "join": {"joinables": ["a"]},
      "loop": [{"kind": "joinable_call", "joinable": "a", "num_allreduces": math.inf}]},
     "loop[0].num_allreduces: inf is not a finite number"),
    ({"joinables": [{"name": "a", "kind": "allreducer"}], "join": {"joinables": ["a"], "kwargs": {"num_allreduces": 2.5}}},
     "join.kwargs.num_allreduces: must be a whole number >= 0"),
    ({"join": {"joinables": ["ddp"], "kwargs": {"sync_max_count": 1}}, "model": {"params": [1]}},
     "join.kwargs.sync_max_count: must be true or false"),
    ({"timeout_s": math.inf}, "timeout_s: inf is not a finite number"),
    ({"timeout_s": 1e9}, "timeout_s: Input should be less than or equal to 86400"),
    ({"loop": [{"kind": "compute", "seconds": 1e300}]}, "loop[0].seconds: Input should be less than or equal to 86400"),
    ({"loop": [{**ALLREDUCE, "numel": 2**60}]}, "loop[0].numel: Input should be less than or equal to"),
    ({"seed": 10**100}, "seed: a 333-bit integer is out of range (at most 64 bits)"),
    ({"world_size": True}, "world_size: Input should be a valid integer, got bool True"),
    ({"loop": [{**ALLREDUCE, "async": 1}]}, "loop[0].async: Input should be a valid boolean, got int 1"),
    ({"topology": {"preset": "nope"}}, "topology.preset: unknown preset 'nope'"),
    ({"world_size": 9, "inputs": {"base": 1}, "topology": {"preset": "switch8"}}, "topology.preset: switch8 has 8 GPUs"),
    ({"topology": {"algorithms": {"all_reduce": "nope"}}}, "topology.algorithms.all_reduce: unknown algorithm 'nope'"),
    ({"topology": {"nodes": [{"name": "a", "ranks": [0]}, {"name": "b", "ranks": [1]}]}},
     "topology.links: ranks [1] cannot reach rank 0"),
    ({"topology": {"nodes": [{"name": "a", "ranks": [0, 1]}, {"name": "a"}]}}, "topology.nodes[1].name: duplicate node"),
    ({"inputs": {"counts": [1] * 2000}}, "inputs.counts: List should have at most 1024 items"),
], ids=lambda x: None if isinstance(x, dict) else x[:40])
def test_values_are_rejected_not_coerced(patch, expect):
    t = time.monotonic()
    with pytest.raises(ScenarioError) as ei:
        parse_scenario({**BASE, **patch}, source="s.toml")
    msg = str(ei.value)
    assert msg.startswith("s.toml: ") and expect in msg and "\n" not in msg, msg
    assert time.monotonic() - t < 5.0


def test_a_huge_dict_is_refused_fast():
    t = time.monotonic()
    with pytest.raises(LimitError, match=r"s.toml: it holds more than 1,000,000 values, over the limit .*"
                                         "SIMDIST_MAX_DATA_ITEMS="):
        parse_scenario({**BASE, "inputs": {"counts": [1] * 4_000_000}}, source="s.toml")
    assert time.monotonic() - t < 2.0


def test_a_self_containing_dict_is_too_deep_not_a_recursion_error():
    d = {**BASE, "expect": {"observed": {}}}
    d["expect"]["observed"]["x"] = [d]
    with pytest.raises(ScenarioError, match="nested more than 32 levels deep"):
        parse_scenario(d, source="api")


def test_values_torch_takes_are_still_accepted():
    s = parse_scenario({**BASE, "loop": [{**ALLREDUCE, "dtype": "uint8", "value": "iteration"},
                                         {**ALLREDUCE, "dtype": "float16", "value": 65504.0}],
                        "after": [{**ALLREDUCE, "dtype": "uint8", "value": "iteration"}]})
    assert simulate(s).outcome == "completed"


# ----------------------------------------------------------------------------- resource limits
def test_a_billion_inputs_are_refused_before_any_work(tmp_path):
    p = _scenario_file(tmp_path, "world_size = 2\n[inputs]\nbase = 1000000000\n[[loop]]\nkind = 'compute'\n"
                                 "seconds = 1\n")
    t = time.monotonic()
    res = run_cli("run", str(p))
    line = _one_line_error(res)
    assert f"{p}: inputs: a run may perform up to 4,000,000,004 operations" in line
    assert "set SIMDIST_MAX_OPS=5000000000 to allow it" in line
    assert time.monotonic() - t < 10
    with pytest.raises(LimitError, match="SIMDIST_MAX_OPS"):
        simulate(load_scenario(p))


def test_the_ops_limit_can_be_raised(monkeypatch):
    s = parse_scenario({"world_size": 2, "inputs": {"counts": [5, 5]}, "loop": [ALLREDUCE]})
    monkeypatch.setenv("SIMDIST_MAX_OPS", "10")
    with pytest.raises(LimitError, match=r"up to 24 operations .* over the limit of 10 operations per run \(set "
                                         r"SIMDIST_MAX_OPS=50 to allow it\)"):
        simulate(s)
    monkeypatch.setenv("SIMDIST_MAX_OPS", "24")
    assert simulate(s).outcome == "completed"
    monkeypatch.setenv("SIMDIST_MAX_OPS", "lots")
    with pytest.raises(InputError, match="SIMDIST_MAX_OPS: not a whole number"):
        simulate(s)


def test_the_engine_refuses_more_trace_entries_than_the_limit(monkeypatch):
    """The backstop: should the estimate ever be short, the run stops at the limit."""
    import simdist.sim

    s = parse_scenario({"world_size": 2, "inputs": {"counts": [50, 50]}, "loop": [ALLREDUCE]})
    monkeypatch.setattr(simdist.sim, "check_ops", lambda *_: None)
    monkeypatch.setenv("SIMDIST_MAX_OPS", "60")
    with pytest.raises(LimitError, match="recorded more than 60 collectives"):
        simulate(s)


def test_bundled_runs_stay_within_their_estimate():
    from simdist.program.budget import estimate

    for p in sorted(SCENARIOS.glob("*.toml")):
        s = load_scenario(p)
        assert sum(len(r.trace) for r in simulate(s).ranks) <= estimate(s).total, p.name


def test_mismatched_huge_collectives_are_refused_in_bounded_memory(tmp_path):
    d = {**BASE, "loop": [{**ALLREDUCE, "numel": 10**12, "ranks": [0]}, {**ALLREDUCE, "numel": 10**12 + 1, "ranks": [1]}]}
    s = parse_scenario(d)
    tracemalloc.start()
    t = time.monotonic()
    try:
        with pytest.raises(LimitError, match="takes 15,258,792 Gloo messages, over the limit of 200,000 .*"
                                             "SIMDIST_MAX_MESSAGES=20000000"):
            simulate(s)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert time.monotonic() - t < 5 and peak < 20 << 20, peak
    p = _scenario_file(tmp_path, _toml(d))
    assert "simulation: modelling the mismatched collective" in _one_line_error(run_cli("run", str(p)))


def test_a_modest_mismatch_is_still_modelled():
    d = {**BASE, "loop": [{**ALLREDUCE, "numel": 10**7, "ranks": [0]}, {**ALLREDUCE, "numel": 10**7 + 1, "ranks": [1]}]}
    report = simulate(parse_scenario(d))
    assert report.outcome == "error" and any(f.kind == "size_mismatch" for f in report.findings)


def _toml(d: dict) -> str:
    import tomli_w

    return tomli_w.dumps(d)


def test_json_of_a_long_run_is_streamed_in_constant_memory():
    """`--json` memory is the report's, not ten times it: writing needs memory for one item."""
    text = (SCENARIOS / "ddp_join_uneven.toml").read_text().replace("counts = [5, 6]", "counts = [5000, 5000]")
    d = tomllib.loads(text)
    del d["expect"]
    report = simulate(parse_scenario(d))
    assert sum(len(r.trace) for r in report.ranks) > 30_000
    tracemalloc.start()
    try:
        sink = _CountingSink()
        report.write_json(sink)
        _, peak = tracemalloc.get_traced_memory()
    finally:
        tracemalloc.stop()
    assert sink.chars > 10 << 20 and peak < 2 << 20, (sink.chars, peak)  # > 10 MB written, < 2 MB held
    assert report.to_json() == json.dumps(asdict(report), indent=2)  # the same text as before


class _CountingSink(io.TextIOBase):
    def __init__(self) -> None:
        self.chars = 0

    def write(self, s: str) -> int:
        self.chars += len(s)
        return len(s)


def test_infinity_in_reports_is_written_as_valid_json(tmp_path):
    p = _scenario_file(tmp_path, "world_size = 2\n[inputs]\ncounts = [1, 1]\n[[loop]]\nkind = 'collective'\n"
                                 "op = 'all_reduce'\nvalue = 3e38\nobserve = 'x'\n")
    for cmd in (["run", "--json"], ["check", "--json"]):
        res = run_cli(*cmd, str(p))
        doc = _strict_json(res.stdout)
        rep = doc.get("report", doc)
        assert rep["ranks"][0]["observed"]["x"] == ["inf"] and "RuntimeWarning" not in res.stderr


# ----------------------------------------------------------------------------- templates
@pytest.mark.parametrize("patch,expect", [
    ({"world_size": 10**18}, "world_size: 1000000000000000000 is more than 1024 ranks"),
    ({"world_size": {"range": [2, 10**18]}}, "world_size: 1000000000000000000 is more than 1024 ranks"),
    ({"inputs": {"counts": {"each": {"each": {"range": [0, 3]}}}}}, "an 'each' inside an 'each' is not allowed"),
    ({"inputs": {"counts": {"each": {"range": [0, 10**9]}}}}, "inputs: a run may perform up to"),
    ({"fuzz": {"budget": 10**18}}, "fuzz.budget: must be <= 10,000,000"),
    ({"timeout_s": {"range": [1, math.inf]}}, "timeout_s.range[1]: inf is not a finite number"),
    ({"range": [0, 1]}, "range: unknown key"),
], ids=["world-1e18", "world-range-1e18", "each-each", "counts-1e9", "budget", "inf-range", "top-level-marker-key"])
def test_template_errors_come_before_any_expansion(patch, expect):
    t = time.monotonic()
    with pytest.raises(SimdistError) as ei:
        parse_template({"world_size": {"range": [2, 3]}, "inputs": {"counts": {"each": {"range": [0, 2]}}},
                        "loop": [ALLREDUCE], **patch}, source="t.toml")
    msg = str(ei.value)
    assert msg.startswith("t.toml: ") and expect in msg and "\n" not in msg, msg
    assert time.monotonic() - t < 2.0


# ----------------------------------------------------------------------------- the fuzzer's files
NAMES = ["../../x", "/tmp/abs-name", "a/b", "nul\x00byte", "\U0001F600 emoji", "[/] markup", "..", ""]


@pytest.mark.parametrize("name", NAMES, ids=["dotdot", "absolute", "slash", "nul", "emoji", "markup", "dots", "empty"])
def test_counterexamples_stay_in_out_and_read_back(tmp_path, name):
    t = parse_template({**tomllib.loads((TEMPLATES / "no_join.toml").read_text()), "name": name},
                       source=str(TEMPLATES / "no_join.toml"))
    out = tmp_path / "a" / "b" / "out"
    before = set(tmp_path.rglob("*"))
    res = fuzz_template(t, budget=30, seed=0, out_dir=out, use_db=False)
    assert res.counterexamples
    new = set(tmp_path.rglob("*")) - before
    assert new and all(out in p.parents or p == out or p in out.parents for p in new), new
    for c in res.counterexamples:
        path = Path(c.path)
        assert path.parent == out and path.name.isascii() and not path.name.startswith((".", "-"))
        s = load_scenario(path)  # TOML that reads back, and replays with the same verdict
        assert s.expect is not None and simulate(s).outcome == s.expect.outcome
    assert not list(Path("/tmp").glob("abs-name*"))


def test_an_api_template_with_none_values_writes_a_readable_counterexample(tmp_path):
    d = tomllib.loads((TEMPLATES / "no_join.toml").read_text())
    d["loop"][0]["every"] = None  # the API's "not given"
    res = fuzz_template(parse_template(d, source="api"), budget=30, seed=0, out_dir=tmp_path, use_db=False)
    assert res.counterexamples and all(load_scenario(c.path) for c in res.counterexamples)


def test_a_counterexample_is_on_disk_before_shrinking_ends(tmp_path, monkeypatch):
    import simdist.fuzz.runner as runner

    t = load_template(TEMPLATES / "no_join.toml")
    seen: list[list[str]] = []
    real_greedy = runner.greedy_shrink

    def spy(d, key, checker, **kw):  # the post-shrink starts only after hypothesis's shrinking
        seen.append(sorted(p.name for p in tmp_path.glob("*.toml")))
        return real_greedy(d, key, checker, **kw)

    monkeypatch.setattr(runner, "greedy_shrink", spy)
    res = fuzz_template(t, budget=50, seed=0, out_dir=tmp_path, use_db=False)
    assert seen and seen[0], "no file was written while the search was still shrinking"
    final = sorted(p.name for p in tmp_path.glob("*.toml"))
    assert final == sorted(Path(c.path).name for c in res.counterexamples)  # the unshrunk file was replaced
    assert "shrunk by hypothesis" in Path(res.counterexamples[0].path).read_text()


def test_ctrl_c_during_the_search_writes_what_was_found(tmp_path, monkeypatch):
    import simdist.fuzz.runner as runner

    t = load_template(TEMPLATES / "no_join.toml")

    def interrupted(*_a, **_k):
        raise KeyboardInterrupt

    monkeypatch.setattr(runner, "greedy_shrink", interrupted)
    with pytest.raises(FuzzInterrupted) as ei:
        fuzz_template(t, budget=50, seed=0, out_dir=tmp_path, use_db=False)
    paths = [c.path for c in ei.value.result.counterexamples]
    assert paths and all(Path(p).exists() for p in paths)
    assert "the search was interrupted (Ctrl-C)" in Path(paths[0]).read_text()
    assert load_scenario(paths[0]).expect is not None


def test_sigint_to_simdist_fuzz_after_a_failure_leaves_the_counterexample(tmp_path):
    """The issue's acceptance test: SIGINT to `simdist fuzz` once a failure is found."""
    text = (TEMPLATES / "no_join.toml").read_text()
    slow = tmp_path / "slow.toml"  # long inputs: shrinking takes seconds, time to interrupt it
    slow.write_text(text.replace("range = [0, 6]", "range = [0, 4000]"))
    assert "4000" in slow.read_text()
    out = tmp_path / "out"
    p = subprocess.Popen([sys.executable, "-m", "simdist", "fuzz", str(slow), "--out", str(out), "-n", "100000",
                          "--no-db"], cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        deadline = time.monotonic() + 60
        while not list(out.glob("*.toml")) and time.monotonic() < deadline and p.poll() is None:
            time.sleep(0.01)
        assert list(out.glob("*.toml")) and p.poll() is None, "no counterexample while the fuzzer ran"
        p.send_signal(signal.SIGINT)
        _, err = p.communicate(timeout=60)
    finally:
        if p.poll() is None:
            p.kill()
            p.wait()
    files = list(out.glob("*.toml"))
    assert p.returncode == 130 and len(files) == 1, (p.returncode, err)
    assert f"interrupted: counterexample written: {files[0]}" in err and "Traceback" not in err
    assert load_scenario(files[0]).expect is not None


def test_an_unwritable_out_is_bad_input(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    line = _one_line_error(run_cli("fuzz", str(TEMPLATES / "no_join.toml"), "--out", str(blocker / "out"), "-n", "30",
                                   "--no-db", "-q"))
    assert "--out: cannot write counterexamples" in line


# ----------------------------------------------------------------------------- exit codes
_CRASH = ("import sys, simdist.sim\n"
          "def boom(*a, **k):\n    raise {exc}\n"
          "simdist.sim.simulate = boom\n"
          "sys.argv = ['simdist', 'run', {path!r}]\n"
          "from simdist.cli import main\nmain()\n")


@pytest.mark.parametrize("exc,shown", [
    ("RuntimeError('a bug')", "internal error: RuntimeError: a bug --"),
    ("MemoryError()", "internal error: out of memory"),
    ("EOFError()", "internal error: EOFError --"),
    ("RecursionError('deep')", "internal error: RecursionError: deep --"),
])
def test_a_bug_is_exit_3_with_one_line_saying_where_to_report(exc, shown):
    code = _CRASH.format(exc=exc, path=str(SCENARIOS / "subset_collective.toml"))
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60)
    line = _one_line_error(res, 3)
    assert shown in line and "please report it" in line and "SIMDIST_DEBUG=1" in line
    debug = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=60,
                           env={**os.environ, "SIMDIST_DEBUG": "1"})
    assert "Traceback" in debug.stderr


def test_a_closed_output_pipe_is_not_a_failed_check():
    cmd = [sys.executable, "-m", "simdist", "run", "--json", str(SCENARIOS / "ws8_ddp_zero_join.toml")]
    p = subprocess.Popen(cmd, cwd=ROOT, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert p.stdout is not None and p.stdout.read(10)
    p.stdout.close()  # the reader goes away: `simdist run --json x | head -c 10`
    err = p.stderr.read().decode() if p.stderr else ""
    assert p.wait(timeout=60) == 141 and err == "", err


def test_ctrl_c_is_130_with_a_message(tmp_path):
    p = _scenario_file(tmp_path, (SCENARIOS / "ddp_join_uneven.toml").read_text()
                       .replace("counts = [5, 6]", "counts = [100000, 100000]").split("[expect]")[0])
    proc = subprocess.Popen([sys.executable, "-m", "simdist", "run", str(p)], cwd=ROOT, stdout=subprocess.PIPE,
                            stderr=subprocess.PIPE, text=True)
    time.sleep(3)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and err.strip() == "interrupted", err


def test_markup_in_names_and_groups_is_printed_as_text(tmp_path):
    p = _scenario_file(tmp_path, "name = '[/] [bold]x[/]'\nworld_size = 2\n[inputs]\ncounts = [1, 2]\n"
                                 "[[groups]]\nname = '[/__w/pair.cc:553]'\nranks = [0, 1]\n[[loop]]\nkind = 'collective'\n"
                                 "op = 'all_reduce'\ngroup = '[/__w/pair.cc:553]'\n")
    res = run_cli("run", str(p))
    assert res.returncode == 1 and "Traceback" not in res.stderr and "[/] [bold]x[/]" in res.stdout
    assert "[/__w/pair.cc:553]" in res.stdout


# ----------------------------------------------------------------------------- the real backend
@pytest.mark.parametrize("bad", [-1, 0, math.inf, math.nan, 1e9, True])
def test_timeouts_are_checked(bad):
    with pytest.raises(InputError, match="--timeout: must be a number of seconds above 0"):
        check_timeout(bad)


@pytest.mark.parametrize("bad", ["-1", "0", "inf", "nan"])
def test_simdist_real_rejects_a_bad_timeout_before_starting(bad):
    t = time.monotonic()
    line = _one_line_error(run_cli("real", str(SCENARIOS / "counter_tutorial.toml"), f"--timeout={bad}"))
    assert "--timeout: must be a number of seconds above 0 and at most 86400" in line
    assert time.monotonic() - t < 15


@pytest.mark.real
def test_no_join_exit_from_the_readme_exits_0_with_its_report():
    res = run_cli("real", str(SCENARIOS / "no_join_exit.toml"), timeout=300)
    assert res.returncode == 0, res.stdout + res.stderr
    assert "all expectations met" in res.stdout and "Traceback" not in res.stderr
    flat = "".join(res.stdout.replace("│", " ").split())  # the table wraps Gloo's error over lines
    assert re.search(r"\[/__w/pytorch/\S*/pair\.cc:\d+\]Connectionclosedbypeer", flat), res.stdout  # as text


@pytest.mark.real
def test_the_temporary_folder_goes_when_simdist_real_is_sigkilled(tmp_path):
    from .test_real_backend import _processes_mentioning

    tmp = tmp_path / "tmp"
    tmp.mkdir()
    sc = _scenario_file(tmp_path, "world_size = 2\ntimeout_s = 120\n[inputs]\ncounts = [1, 1]\n[[loop]]\n"
                                  "kind = 'sleep'\nseconds = 60\n")
    p = subprocess.Popen([sys.executable, "-m", "simdist", "real", str(sc)], cwd=ROOT, stdout=subprocess.DEVNULL,
                         stderr=subprocess.DEVNULL, env={**os.environ, "TMPDIR": str(tmp)})
    try:
        deadline = time.monotonic() + 120
        run_dir = None
        while time.monotonic() < deadline and run_dir is None:
            dirs = [d for d in tmp.iterdir() if d.name.startswith("simdist-real-") and list(d.glob("rank*.progress"))]
            run_dir = dirs[0] if dirs else None
            time.sleep(0.1)
        assert run_dir is not None, "the run never started"
    finally:
        p.kill()
        p.wait()
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and (run_dir.exists() or _processes_mentioning(str(run_dir))):
        time.sleep(0.2)
    assert not run_dir.exists() and not list(tmp.iterdir())
    assert _processes_mentioning(str(run_dir)) == []


@pytest.mark.real
def test_an_abort_at_shutdown_after_the_record_is_not_a_failure(tmp_path, monkeypatch):
    from real_backend.launch import run_real
    from real_backend.worker import FAULT_ENV

    monkeypatch.setenv(FAULT_ENV, "terminate_at_exit")
    s = load_scenario(SCENARIOS / "counter_tutorial.toml", target="real")
    report = run_real(s, workdir=tmp_path / "wd")
    logs = [(tmp_path / "wd" / f"rank{r}.log").read_text() for r in range(2)]
    assert all("terminate called without an active exception" in log for log in logs)  # it did happen
    assert report.outcome == "completed" and [r.status for r in report.ranks] == ["completed", "completed"]
    assert [r.inputs_processed for r in report.ranks] == [5, 6]
    assert sum("ended by SIGABRT after it had finished and written its record" in n for n in report.notes) == 2


# ----------------------------------------------------------------------------- the property
def _generator():
    spec = importlib.util.spec_from_file_location("malformed_inputs", ROOT / "bench" / "malformed_inputs.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    sys.modules["malformed_inputs"] = mod  # dataclasses look their module up
    spec.loader.exec_module(mod)
    return mod


MALFORMED = _generator()
BASES = MALFORMED._bases()


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(rng=st.randoms(use_true_random=False), index=st.integers(0, 10**6))
def test_malformed_inputs_are_rejected_in_one_line_or_run(rng: random.Random, index: int):
    """bench/malformed_inputs.py's generator, driven by hypothesis (which shrinks a failure to
    a small input): every input either runs (and writes valid JSON) or is refused with one
    SimdistError line that starts with its source; nothing else escapes, nothing takes long."""
    case = MALFORMED.make_case(index, rng, BASES)
    old = os.environ.get("SIMDIST_MAX_OPS")
    os.environ["SIMDIST_MAX_OPS"] = "20000"  # keeps accepted runs short: the property is about bad input
    try:
        with tempfile.TemporaryDirectory() as d:
            t = time.monotonic()
            try:
                status, _, json_ok = MALFORMED.exercise(case, Path(d), fuzz=False)
                assert json_ok
            except SimdistError as e:
                msg = str(e)
                assert "\n" not in msg, msg
                # loading names its source; a limit met by the run names the scenario or the collective
                source = f"case-{index}" if case.how == "dict" else ""
                assert msg.startswith(source) or isinstance(e, LimitError), msg
            assert time.monotonic() - t < 10
    finally:
        if old is None:
            os.environ.pop("SIMDIST_MAX_OPS", None)
        else:
            os.environ["SIMDIST_MAX_OPS"] = old
