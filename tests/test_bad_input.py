"""Issue 16, bad input: no scenario, template or file crashes, hangs or exhausts simdist.

Every loader and resource-limit repro of the issue is a case here (undecodable, deep, huge
or special files; inf/nan and coerced values; work and memory bounds; template expansion),
plus a hypothesis property over `simdist.testing.malformed`'s generator of malformed inputs.
What happens to runs (the fuzzer's files, exit codes, Ctrl-C, the real backend) is in
test_reliability.py; the store on loopback in test_procs.py and test_real_backend.py.
"""

from __future__ import annotations

import io
import json
import math
import os
import random
import tempfile
import time
import tracemalloc
from pathlib import Path

import pytest
import tomllib
import typer
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from simdist.errors import InputError, LimitError, ScenarioError, ScriptError, SimdistError
from simdist.fuzz.template import parse_template
from simdist.scenario import load_scenario, parse_scenario
from simdist.sim import simulate
from simdist.testing import malformed

from .conftest import SCENARIOS, one_line_error, run_cli, scenario_file, strict_json

BASE = {"world_size": 2, "inputs": {"counts": [1, 1]}}
ALLREDUCE = {"kind": "collective", "op": "all_reduce"}


# ----------------------------------------------------------------------------- the loader: files
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
    p = scenario_file(tmp_path, data)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(p)
    msg = str(ei.value)
    assert msg.startswith(f"{p}: ") and expect in msg and "\n" not in msg, msg
    line = one_line_error(run_cli("run", str(p)))
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
    strict_json(path.read_text())
    back = load_profile(path)
    assert back.predict("all_reduce", 2e6, 2) == pytest.approx(2e-5 + 2e6 * 1e-9)
    # files written before the open end was null still load
    path.write_text(path.read_text().replace('"hi": null', '"hi": Infinity'))
    assert load_profile(path).predict("all_reduce", 2e6, 2) == pytest.approx(2e-5 + 2e6 * 1e-9)


@pytest.mark.parametrize("content,expect", [
    (None, "measurements file is not a regular file (a character device)"),
    ("[1]", "is not a --save-raw file (it needs raw.train and raw.test)"),
    ('{"raw": {"train": [[{"op": 1}]], "test": []}}', "is not a --save-raw file (0.0.op: Input should be a valid string)"),
    ('{"raw": {"train": [], "test": []}}', "holds no measurements"),
    ('{"raw": {"train": [], "test": []}, "gamma": NaN}', "not valid JSON (NaN is not a finite number)"),
], ids=["dev-zero", "not-a-dict", "wrong-row", "empty", "nan"])
def test_compare_timing_load_reads_a_measurements_file_as_user_input(tmp_path, content, expect):
    path = Path("/dev/zero") if content is None else scenario_file(tmp_path, content, "raw.json")
    line = one_line_error(run_cli("compare-timing", "--load", str(path)))
    assert line.startswith("error: load: ") and expect in line, line


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
    p = scenario_file(tmp_path, "world_size = 2\n[inputs]\nbase = 1000000000\n[[loop]]\nkind = 'compute'\n"
                                 "seconds = 1\n")
    line = one_line_error(run_cli("run", str(p)))
    assert f"{p}: inputs: a run may perform up to 4,000,000,004 operations" in line
    assert "set SIMDIST_MAX_OPS=5000000000 to allow it" in line
    # timed through the API: a CLI call's time is mostly the interpreter's start-up, which on a
    # loaded host alone can pass 10 s (bench/malformed_inputs.py subtracts it for that reason)
    t = time.monotonic()
    with pytest.raises(LimitError, match="SIMDIST_MAX_OPS"):
        simulate(load_scenario(p))
    assert time.monotonic() - t < 2


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
    p = scenario_file(tmp_path, _toml(d))
    assert "simulation: modelling the mismatched collective" in one_line_error(run_cli("run", str(p)))


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
    assert report.to_json() == json.dumps(report.to_dict(), indent=2)  # the same text as to_dict


class _CountingSink(io.TextIOBase):
    def __init__(self) -> None:
        self.chars = 0

    def write(self, s: str) -> int:
        self.chars += len(s)
        return len(s)


def test_infinity_in_reports_is_written_as_valid_json(tmp_path):
    p = scenario_file(tmp_path, "world_size = 2\n[inputs]\ncounts = [1, 1]\n[[loop]]\nkind = 'collective'\n"
                                 "op = 'all_reduce'\nvalue = 3e38\nobserve = 'x'\n")
    for cmd in (["run", "--json"], ["check", "--json"]):
        res = run_cli(*cmd, str(p))
        doc = strict_json(res.stdout)
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


# ----------------------------------------------------------------------------- the property
BASES = malformed.bundled_bases(SCENARIOS)


@settings(max_examples=300, deadline=None, suppress_health_check=list(HealthCheck), database=None)
@given(rng=st.randoms(use_true_random=False), index=st.integers(0, 10**6))
def test_malformed_inputs_are_rejected_in_one_line_or_run(rng: random.Random, index: int):
    """`simdist.testing.malformed`'s generator, driven by hypothesis (which shrinks a failure to
    a small input): every input either runs (and writes valid JSON) or is refused with a
    SimdistError whose every line (one per problem) starts with its source; nothing else
    escapes, nothing takes long."""
    case = malformed.make_case(index, rng, BASES)
    old = os.environ.get("SIMDIST_MAX_OPS")
    os.environ["SIMDIST_MAX_OPS"] = "20000"  # keeps accepted runs short: the property is about bad input
    try:
        with tempfile.TemporaryDirectory() as d:
            t = time.monotonic()
            try:
                status, _, json_ok = malformed.exercise(case, Path(d), fuzz=False)
                assert json_ok
            except SimdistError as e:
                # one line per problem (a file's every problem at once), each naming its source;
                # a limit met by the run names the scenario or the collective
                source = f"case-{index}" if case.how == "dict" else ""
                for line in str(e).splitlines():
                    assert line.startswith(source) or isinstance(e, LimitError), str(e)
            assert time.monotonic() - t < 10
    finally:
        if old is None:
            os.environ.pop("SIMDIST_MAX_OPS", None)
        else:
            os.environ["SIMDIST_MAX_OPS"] = old


def test_script_rank_processes_are_limited_before_any_starts(tmp_path, capsys):
    """Each script rank is a process importing torch: a world of 100,000 is refused at once,
    naming the option and the variable that raises the limit; the fuzzer's range too."""
    from simdist.cli.fuzz_script import fuzz_script_command
    from simdist.script import run_script

    p = scenario_file(tmp_path, "import torch\n", "train.py")
    with pytest.raises(LimitError, match=r"^nproc_per_node: 100,000 rank processes, over the limit of 64 .*"
                                         r"SIMDIST_MAX_LOCAL_RANKS=100000"):
        run_script(p, nproc_per_node=100_000)
    with pytest.raises(typer.Exit) as stop:  # bad_input: one line, exit 2
        fuzz_script_command([p], budget=1, seed=0, out_dir=tmp_path, no_shrink=True, json_=True, quiet=True,
                            nproc=None, nproc_range="2:65", batches_range="1:2", backend=None, timeout=None)
    assert stop.value.exit_code == 2
    assert "error: --nproc-per-node-range: 65 rank processes, over the limit of 64" in capsys.readouterr().err


def test_a_script_that_starts_its_own_ranks_is_limited_at_its_first_rank(tmp_path, script_zygote):
    """Without --nproc-per-node the script starts its ranks itself (mp.spawn): the world its
    first rank initialises is checked against the same limit, one line, not a wait for them."""
    from simdist.script import run_script

    p = scenario_file(tmp_path, "import torch.distributed as dist\n"
                      "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:29511', rank=0, world_size=100)\n",
                      "spawned.py")
    with pytest.raises(ScriptError, match=r"^script: world_size=100 rank processes, over the limit of 64 .*"
                                          r"SIMDIST_MAX_LOCAL_RANKS=100 to allow it\)$"):
        run_script(p, timeout_s=30, zygote=script_zygote("sim"))


def test_an_output_folder_that_cannot_be_made_is_bad_input_before_any_work(tmp_path):
    """access() says yes to root in /proc; creating a folder there fails: checked by trying,
    so `fuzz --out /proc/x` is one line and exit 2, not a crash after the search (exit 3)."""
    from simdist.cli.console import check_output_folder

    with pytest.raises(InputError, match=r"^out: cannot write in /proc"):
        check_output_folder(Path("/proc/simdist-no/such"), "out")
    check_output_folder(tmp_path / "new" / "folder", "out")  # can be made: fine, and nothing is left behind
    assert list(tmp_path.iterdir()) == []
