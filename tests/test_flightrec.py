"""`simdist diagnose` / `export` on Flight Recorder dumps, without starting torch processes.

The dumps under tests/data/flightrec/ are real Gloo runs of the bundled failing scenarios,
written by torch where TORCH_FR_DUMP_TEMP_FILE said and with torchelastic's error files
(bench/record_fr_dumps.py; tests/test_flightrec_real.py records one live and replays them
on Gloo). Here: their diagnosis equals `simdist check` on the scenario, their replay equals
it in the simulator, torch's own analyzer reads simdist's exports, and bad files are refused.
"""

from __future__ import annotations

import json
import os
import pickle
from pathlib import Path

import pytest

from simdist.check.classify import failing_entry
from simdist.check.explain import annotate_report
from simdist.errors import DumpError
from simdist.flightrec.diagnose import diagnose
from simdist.flightrec.export import export_dumps, write_dumps, write_error_files
from simdist.flightrec.format import fr_env
from simdist.flightrec.ingest import load_dumps
from simdist.flightrec.unpickle import loads_plain
from simdist.scenario import load_scenario, parse_scenario
from simdist.sim import simulate

from .conftest import ROOT, SCENARIOS, run_cli

DATA = Path(__file__).resolve().parent / "data" / "flightrec"


def failing_bundled() -> list[str]:
    """Every bundled scenario the checker fails (hang, error or mismatch), by name."""
    from simdist.check.classify import check_run

    out = []
    for path in sorted(SCENARIOS.glob("*.toml")):
        s = load_scenario(path)
        if check_run(simulate(s), s).failed:
            out.append(path.stem)
    return out


FAILING = failing_bundled()


def blocked(report, rank: int):
    """What `simdist check` names as the operation a rank is stuck or failed in."""
    e = failing_entry(report, rank)
    return None if e is None else (e.op, e.seq, e.group, e.numel, e.dtype)


def verdict_of(report, verdict) -> tuple:
    return (verdict.kind, verdict.outcome, sorted({f.kind for f in verdict.findings}),
            [blocked(report, r.rank) for r in report.ranks])


def checked(name: str) -> tuple:
    s = load_scenario(SCENARIOS / f"{name}.toml")
    rep = simulate(s)
    return verdict_of(rep, annotate_report(rep, s))


def test_every_failing_bundled_scenario_has_recorded_dumps():
    assert len(FAILING) >= 10
    missing = [n for n in FAILING if not (DATA / n).is_dir()]
    assert not missing, f"no recorded dumps for {missing}: run bench/record_fr_dumps.py {' '.join(missing)}"
    manifest = json.loads((DATA / "manifest.json").read_text())
    assert all(manifest[n]["torch"].startswith("2.") for n in FAILING)


@pytest.mark.parametrize("name", FAILING)
def test_diagnosis_of_real_dumps_equals_check(name):
    """Same verdict, same blocked operation per rank, same finding kinds as `simdist check`."""
    d = diagnose([DATA / name])
    assert verdict_of(d.job.report, d.verdict) == checked(name)
    assert d.dumps.version == "2.10" and d.dumps.backend == "gloo"
    assert all(dump.form == "pickle" for dump in d.dumps.dumps.values())


@pytest.mark.parametrize("name", FAILING)
def test_replay_of_real_dumps_gives_the_same_verdict_in_the_simulator(name):
    d = diagnose([DATA / name])
    s = parse_scenario(d.replay)
    rep = simulate(s)
    assert verdict_of(rep, annotate_report(rep, s)) == checked(name)
    assert s.expect is not None and s.expect.outcome == d.verdict.outcome


def test_diagnosis_names_progress_frames_and_errors():
    d = diagnose([DATA / "no_join_hang"])
    world = d.progress[0]
    assert world.group == "WORLD"
    assert world.lines() == ["rank 0: completed #10, nothing pending",
                             "rank 1: completed #10, never completed #11 all_reduce"]
    r1 = d.job.report.ranks[1]
    assert r1.status == "hang" and r1.blocked_in.origin == "ddp.backward.bucket_allreduce"
    frames = d.frame_lines(1, 20)
    assert any("backward" in f for f in frames) and any(f.startswith("> ") and "torchrank.py" in f for f in frames)
    assert any("waits in all_reduce #11 (DDP bucket" in n for n in d.explanation)
    thrown = diagnose([DATA / "allreducer_throw"])
    assert [r.error.category for r in thrown.job.report.ranks] == ["join_early_termination"] * 3
    assert "exhausted all inputs" in thrown.job.report.ranks[0].error.message


@pytest.mark.parametrize("name,family,fix", [
    ("after_loop_barrier", "ranks at different points of the program", "all-reduce a stop flag"),
    ("zero_before_ddp", "Join's shadow out of step", "the model (DDP) first"),
    ("unshadowed_logging", "Join's shadow out of step", "the model (DDP) first"),
    ("forward_collective_syncbn", "Join's shadow out of step", "Join never shadows a raw collective"),
    ("subset_collective", "different collectives at one point", "dist.new_group"),
    ("no_join_hang", "a rank finished while others wait", "wrap the loop in Join([model, ...])"),
    ("join_disabled_uneven", "a rank finished while others wait", "with a disabled one"),
    ("allreducer_throw", "Join raised on early termination", "catch the RuntimeError"),
])
def test_hints_from_the_dumps_name_the_family_and_its_fix(name, family, fix):
    """A job known from its dumps has no scenario: its origins tell the family."""
    hints = [n for n in diagnose([DATA / name]).explanation if n.startswith("hint")]
    assert any(f"hint ({family})" in h and fix in h for h in hints), hints


def test_frames_recorded_on_another_machine_are_read_in_this_torch(tmp_path):
    """Frame paths of the recording machine do not exist here: the installed package's file is read."""
    for r in (0, 1):
        doc = pickle.loads((DATA / "no_join_hang" / f"comm_lib_trace_rank_{r}").read_bytes())
        for e in doc["entries"]:
            for f in e["frames"]:
                f["filename"] = "/elsewhere/env" + f["filename"][f["filename"].find("/lib/python"):] \
                    if "/lib/python" in f["filename"] else "/elsewhere/job/" + Path(f["filename"]).name
        (tmp_path / f"comm_lib_trace_rank_{r}").write_bytes(pickle.dumps(doc))
    here, there = diagnose([DATA / "no_join_hang"]), diagnose([tmp_path])
    assert [e.origin for e in there.job.report.ranks[1].trace] == [e.origin for e in here.job.report.ranks[1].trace]
    assert there.job.report.ranks[1].blocked_in.origin == "ddp.backward.bucket_allreduce"
    assert there.job.report.ranks[1].trace[0].phase == "init"  # DDP's constructor, read from this torch's source


def test_ras_grouping_writes_ranges():
    from simdist.flightrec.diagnose import GroupProgress, RankProgress
    from simdist.report import TraceEntry

    done = TraceEntry(seq=14, op="all_reduce", numel=1, dtype="float32", group="WORLD", group_size=5, origin="x",
                      completed=True)
    late = TraceEntry(seq=13, op="all_reduce", numel=1, dtype="float32", group="WORLD", group_size=5, origin="x",
                      completed=True)
    stuck = TraceEntry(seq=14, op="broadcast", numel=1, dtype="float32", group="WORLD", group_size=5, origin="x")
    p = GroupProgress("WORLD", [RankProgress(r, done, None, 14) for r in (0, 1, 2, 4)]
                      + [RankProgress(3, late, stuck, 14)])
    assert p.lines() == ["ranks 0-2,4: completed #14, nothing pending",
                         "rank 3: completed #13, never completed #14 broadcast"]


# --------------------------------------------------------------------------- export -> torch's analyzer
def fr_trace_text(folder: Path) -> str:
    """torch's analyzer (the `torchfrtrace` entry point) on `folder`, its log as text.

    Run in this process, so what it changes of the process is put back: its loader
    (`flight_recorder/components/loader.py`, `read_dir`) calls `gc.disable()` for speed and
    never re-enables the collector (fine for a command that exits), which left it off for
    every test after this one (tests/test_engine_scale.py checks the collector's state)."""
    import gc
    import io
    import logging

    from torch.distributed.flight_recorder.fr_trace import main

    log = logging.getLogger("Flight Recorder")  # where the analyzer reports, at INFO
    buf = io.StringIO()
    handler = logging.StreamHandler(buf)
    log.addHandler(handler)
    collecting = gc.isenabled()
    try:
        main([str(folder)])
    finally:
        log.removeHandler(handler)
        if collecting:
            gc.enable()
    return buf.getvalue()


@pytest.mark.parametrize("name", FAILING)
def test_torchfrtrace_reads_exports_and_reports_simdists_ranks(name, tmp_path):
    """torch's analyzer reads simdist's dumps and names the ranks simdist names: the culprits
    of a mismatch, the ranks missing from a collective (blocked on, or lost by, the others)."""
    pytest.importorskip("torch")
    s = load_scenario(SCENARIOS / f"{name}.toml")
    rep = simulate(s)
    verdict = annotate_report(rep, s)
    write_dumps(export_dumps(rep, s), tmp_path)
    text = fr_trace_text(tmp_path)
    assert "Traceback" not in text
    issued = [{(e.group, e.seq) for e in r.trace} for r in rep.ranks]
    reported = 0
    for f in verdict.findings:
        missing = set(f.ranks) if f.kind == "hang" else \
            {m for m in f.ranks[1:] if (f.group, f.seq) not in issued[m]} if f.kind == "peer_exited" else set()
        if missing:
            assert f"Not all ranks joining collective, sequence number: {f.seq}" in text
            assert f"missing ranks: {missing}" in text
            reported += 1
        elif f.kind.endswith("_mismatch") or f.kind == "peer_exited":
            block = text.split(f"Collective sequence number: {f.seq} has errors")[1].split("collective stack trace")[0]
            culprits = {int(x.split(";")[0]) for x in block.split("Culprit rank ")[1:]}
            assert culprits and culprits <= set(f.ranks)
            reported += 1
    if reported == 0:  # a rank raised (Join's early termination): every collective matched
        assert "has errors" not in text and "Not all ranks" not in text


def test_torchfrtrace_command_reads_an_export(tmp_path):
    pytest.importorskip("torch")
    r = run_cli("export", str(SCENARIOS / "subset_collective.toml"), "--out", str(tmp_path / "d"))
    assert r.returncode == 0, r.stderr
    assert "wrote 2 dumps" in r.stdout
    import subprocess
    import sys

    p = subprocess.run([sys.executable, "-m", "torch.distributed.flight_recorder.fr_trace", str(tmp_path / "d")],
                       capture_output=True, text=True, timeout=300)
    assert p.returncode == 0 and "Traceback" not in p.stderr
    assert "COLLECTIVE_TYPE_MISMATCH" in p.stderr and "'all_reduce' does not match found collective type: 'barrier'" \
        in p.stderr


@pytest.mark.parametrize("form", ["pickle", "json"])
@pytest.mark.parametrize("name", ["zero_before_ddp", "no_join_exit", "groups_p2p"])
def test_export_then_diagnose_gives_the_run_back(name, form, tmp_path):
    """simdist reads its own dumps (both forms) back to the same verdict and origins."""
    s = load_scenario(SCENARIOS / f"{name}.toml")
    rep = simulate(s)
    verdict = annotate_report(rep, s)
    write_dumps(export_dumps(rep, s), tmp_path, "trace_", form)
    d = diagnose([tmp_path])
    if name == "no_join_exit":  # the error is in no dump: without the error file the rank is still in it
        assert d.verdict.outcome == "hang" and d.job.report.ranks[1].status == "hang"
        assert write_error_files(rep, tmp_path) == [tmp_path / "1" / "error.json"]
        d = diagnose([tmp_path])
    assert verdict_of(d.job.report, d.verdict) == verdict_of(rep, verdict)
    sent = [e.origin for e in rep.ranks[0].trace if e.op not in ("send", "recv")]
    assert [e.origin for e in d.job.report.ranks[0].trace] == sent
    assert {g.name: g.ranks for g in d.job.groups} == {"WORLD": list(range(s.world_size)),
                                                         **{g.name: sorted(g.ranks) for g in s.groups}}


# --------------------------------------------------------------------------- formats: NCCL, versions, names
def _nccl_entry(seq: int, name: str, sizes, state: str, *, record_id: int, pg=("0", "default_pg"), p2p_seq=0,
                p2p=False, frames=True) -> dict:
    e = {"record_id": record_id, "pg_id": 0, "process_group": pg, "collective_seq_id": seq, "p2p_seq_id": p2p_seq,
         "op_id": record_id + 1, "profiling_name": name, "time_created_ns": 1_000 + record_id,
         "input_sizes": sizes, "input_dtypes": ["Float"] * len(sizes), "output_sizes": sizes,
         "output_dtypes": ["Float"] * len(sizes), "state": state, "retired": state == "completed",
         "time_discovered_started_ns": None, "time_discovered_completed_ns": None, "timeout_ms": 600000,
         "is_p2p": p2p}
    if frames:
        e["frames"] = [{"name": "train_step", "filename": "/home/u/train.py", "line": 42}]
    return e


def _nccl_dump(entries: list[dict], version: str = "2.4") -> dict:
    return {"version": version, "pg_config": {"0": {"name": "0", "desc": "default_pg", "ranks": "[0, 1]"}},
            "pg_status": {}, "nccl_comm_state": {}, "entries": entries}


def test_nccl_dump_with_coalesced_group_p2p_and_timeout(tmp_path):
    r0 = [_nccl_entry(1, "nccl:all_reduce", [[4]], "completed", record_id=0),
          _nccl_entry(2, "nccl:_allgather_base", [[2]], "completed", record_id=1),
          _nccl_entry(2, "nccl:_allgather_base", [[3]], "completed", record_id=2),
          _nccl_entry(2, "nccl:coalesced", [], "completed", record_id=3),
          _nccl_entry(2, "nccl:send 0->1", [[5]], "completed", record_id=4, p2p_seq=1, p2p=True),
          _nccl_entry(3, "nccl:all_reduce", [[4]], "started", record_id=5)]
    r1 = [_nccl_entry(1, "nccl:all_reduce", [[4]], "completed", record_id=0),
          _nccl_entry(2, "nccl:_allgather_base", [[2]], "completed", record_id=1),
          _nccl_entry(2, "nccl:_allgather_base", [[3]], "completed", record_id=2),
          _nccl_entry(2, "nccl:coalesced", [], "completed", record_id=3),
          _nccl_entry(2, "nccl:recv 1<-0", [[5]], "completed", record_id=4, p2p_seq=1, p2p=True),
          _nccl_entry(3, "nccl:broadcast", [[4]], "scheduled", record_id=5)]
    for r, entries in enumerate((r0, r1)):
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps(_nccl_dump(entries)))
    d = diagnose([tmp_path])
    t0 = d.job.report.ranks[0].trace
    assert [(e.op, e.seq, e.numel, e.completed) for e in t0] == [
        ("all_reduce", 1, 4, True), ("all_gather", 2, 5, True), ("send", 1, 5, True), ("all_reduce", 3, 4, False)]
    assert t0[2].peer == 1 and d.job.report.ranks[1].trace[2].peer == 0
    assert t0[0].origin == "user.train.py:42" and d.dumps.backend == "nccl"
    assert d.verdict.kind == "op_mismatch" and d.verdict.outcome == "hang"
    assert {f.kind for f in d.verdict.findings} == {"op_mismatch", "deadlock"}
    mismatch = next(f for f in d.verdict.findings if f.kind == "op_mismatch")
    assert mismatch.seq == 3 and "blocks forever" not in mismatch.detail  # Gloo's rules do not speak for NCCL
    assert any(n.startswith("hint (arguments that differ across ranks): the same call (train.py:42)")
               for n in d.explanation)


@pytest.mark.parametrize("version,dropped", [
    ("2.2", ("is_p2p", "timeout_ms", "process_group", "input_dtypes", "output_dtypes", "state")),
    ("2.3", ("is_p2p", "timeout_ms", "process_group")),
    ("2.7", ("is_p2p",)),
    ("2.10", ()),
])
def test_older_format_versions_without_newer_fields(version, dropped, tmp_path):
    """Older releases wrote fewer fields (no is_p2p, timeouts, group names, dtypes, states)."""
    for r in (0, 1):
        e = _nccl_entry(1, "nccl:allreduce", [[8]], "completed" if r == 0 else "scheduled", record_id=0, frames=False)
        for key in dropped:
            e.pop(key)
        if "state" in dropped:
            e["retired"] = r == 0
        (tmp_path / f"dump_{r}.json").write_text(json.dumps(_nccl_dump([e], version)))
    d = diagnose([tmp_path])
    assert [r.status for r in d.job.report.ranks] == ["completed", "hang"]
    assert d.job.report.ranks[1].blocked_in.op == "all_reduce" and d.job.groups[0].name == "WORLD"


def test_dump_file_names_follow_torchs_writer(tmp_path):
    """``${TORCH_FR_DUMP_TEMP_FILE}<rank>``, any prefix, optionally .json/.pkl; files given one by one."""
    s = load_scenario(SCENARIOS / "no_join_hang.toml")
    docs = export_dumps(simulate(s), s)
    write_dumps(docs, tmp_path / "a", "my_job-trace.")
    dumps = load_dumps([tmp_path / "a"])
    assert sorted(dumps.dumps) == [0, 1] and dumps.dumps[1].path.name == "my_job-trace.1"
    one = load_dumps([tmp_path / "a" / "my_job-trace.1"])
    assert one.world_size == 2 and one.missing == [0] and any("no dump for rank(s) [0]" in n for n in one.notes)
    d = diagnose([tmp_path / "a" / "my_job-trace.1"])
    assert d.job.report.ranks[0].status == "aborted" and d.verdict.failed


# --------------------------------------------------------------------------- bad input
class _Evil:
    def __reduce__(self):
        return (os.system, (f"touch {self.marker}",))  # type: ignore[attr-defined]


def test_malicious_pickle_is_refused_without_running(tmp_path):
    marker = tmp_path / "pwned"
    evil = _Evil()
    evil.marker = marker  # type: ignore[attr-defined]
    data = pickle.dumps({"version": "2.10", "entries": [], "x": evil})
    with pytest.raises(pickle.UnpicklingError, match="posix.system|os.system"):
        loads_plain(data)
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "comm_lib_trace_rank_0").write_bytes(data)
    r = run_cli("diagnose", str(tmp_path / "d"))
    assert r.returncode == 2 and not marker.exists()
    assert r.stderr.count("\n") == 1 and "refused to load this pickle" in r.stderr and "Traceback" not in r.stderr


@pytest.mark.parametrize("content,message", [
    (None, "cannot read the pickle"),  # truncated: the first half of a real dump
    (b"\x89PNG\r\n\x1a\n....", "neither a pickle nor JSON"),
    (b"{\"version\": \"2.10\", \"entries\": [", "not valid JSON"),
    (json.dumps({"hello": 1}).encode(), "no 'version' field"),
    (json.dumps({"version": "3.0", "entries": []}).encode(), "format version '3.0'"),
    (json.dumps({"version": "2.10", "entries": [{"profiling_name": "gloo:all_reduce"}]}).encode(),
     "has no 'collective_seq_id'"),
])
def test_truncated_or_foreign_file_is_one_line_exit_2(content, message, tmp_path):
    if content is None:
        real = (DATA / "no_join_hang" / "comm_lib_trace_rank_0").read_bytes()
        content = real[: len(real) // 2]
    path = tmp_path / "trace_0"
    path.write_bytes(content)
    with pytest.raises(DumpError, match="trace_0"):
        load_dumps([path])
    r = run_cli("diagnose", str(path))
    assert r.returncode == 2, r.stdout
    assert r.stderr.count("\n") == 1 and message in r.stderr and "Traceback" not in r.stderr


def test_foreign_files_in_a_folder_are_skipped_broken_dumps_are_not(tmp_path):
    for r in (0, 1):
        (tmp_path / f"comm_lib_trace_rank_{r}").write_bytes((DATA / "no_join_hang" / f"comm_lib_trace_rank_{r}")
                                                           .read_bytes())
    (tmp_path / "core.4242").write_bytes(b"\x7fELF....")
    d = diagnose([tmp_path])
    assert sorted(d.dumps.dumps) == [0, 1] and any("core.4242" in n for n in d.explanation)
    (tmp_path / "old_trace_2").write_bytes(b"\x80\x02}q\x00(X")  # a pickle, cut short
    with pytest.raises(DumpError, match="old_trace_2: cannot read the pickle"):
        diagnose([tmp_path])


def test_no_dumps_and_duplicate_ranks_are_bad_input(tmp_path):
    (tmp_path / "notes.txt").write_text("hello")
    r = run_cli("diagnose", str(tmp_path))
    assert r.returncode == 2 and "no Flight Recorder dump found" in r.stderr
    src = DATA / "no_join_hang" / "comm_lib_trace_rank_0"
    r = run_cli("diagnose", str(src), str(src))
    assert r.returncode == 2 and "two dumps for rank 0" in r.stderr


# --------------------------------------------------------------------------- CLI
def test_cli_diagnose_text_json_replay_and_exit_codes(tmp_path):
    replay = tmp_path / "replay.toml"
    r = run_cli("diagnose", str(DATA / "unshadowed_logging"), "--replay", str(replay), "--graph",
                str(tmp_path / "g.dot"))
    assert r.returncode == 1, r.stderr  # a failure was found
    out = r.stdout
    assert "size_mismatch (hang)" in out and "finding deadlock" in out and "deadlock core [0, 1]" in out
    assert "ranks grouped by how far they got" in out and "never completed #18 all_reduce" in out
    assert "frames of rank 0's all_reduce #18 on WORLD" in out
    assert replay.read_text().startswith("# simdist diagnose --replay") and (tmp_path / "g.dot").exists()
    assert run_cli("run", str(replay)).returncode == 0  # its [expect] (the outcome) holds in the simulator
    j = run_cli("diagnose", str(DATA / "unshadowed_logging"), "--json")
    doc = json.loads(j.stdout)
    assert doc["verdict"]["kind"] == "size_mismatch" and doc["replay"]["world_size"] == 2
    assert doc["ras"]["WORLD"] and doc["frames"]["0"] and "digraph" in doc["waitfor_dot"]


def test_cli_export_writes_dumps_diagnose_reads(tmp_path):
    r = run_cli("export", str(SCENARIOS / "groups_p2p.toml"), "-o", str(tmp_path), "--format", "json")
    assert r.returncode == 0, r.stderr
    assert sorted(p.name for p in tmp_path.iterdir()) == [f"comm_lib_trace_rank_{k}.json" for k in range(4)]
    d = run_cli("diagnose", str(tmp_path))
    assert d.returncode == 0 and "ok (completed)" in d.stdout
    bad = run_cli("export", str(ROOT / "nope.toml"), "-o", str(tmp_path))
    assert bad.returncode == 2


def test_fr_env_gives_the_ranks_absolute_paths(tmp_path, monkeypatch):
    """`simdist real --fr-dumps dumps/` from any folder: the ranks run in the repository's
    folder, so a relative prefix would send their dumps (and error files) elsewhere."""
    monkeypatch.chdir(tmp_path)
    env = fr_env(Path("dumps"), 1, on_demand=True)
    assert env and all(Path(v).is_absolute() and Path(v).is_relative_to(tmp_path / "dumps") for v in env.values())
    assert (tmp_path / "dumps" / "1").is_dir()


def test_a_groups_configured_ranks_keep_torchs_group_rank_order(tmp_path):
    """torch writes a group's pg_config "ranks" in group-rank order (`pg_config_info`: the keys
    of `pg_group_ranks`, made by enumerating new_group's ranks, unsorted where
    `sort_ranks=False`), and a p2p's profiling name numbers its ends by group rank. Group
    [2, 0]: rank 2 (group rank 0) sends to group rank 1, rank 0. The rebuild sorted the
    configured ranks, so it named rank 2 as its own send's peer."""
    config = {"0": {"name": "0", "desc": "default_pg", "ranks": "[]"}, "1": {"name": "1", "desc": "sub", "ranks": "[2, 0]"}}
    sub = ("1", "sub")
    p2p = {0: _nccl_entry(1, "nccl:recv 1<-0", [[5]], "completed", record_id=1, pg=sub, p2p_seq=1, p2p=True),
           2: _nccl_entry(1, "nccl:send 0->1", [[5]], "completed", record_id=1, pg=sub, p2p_seq=1, p2p=True)}
    for r in range(3):
        entries = [_nccl_entry(1, "nccl:all_reduce", [[4]], "completed", record_id=0)] + ([p2p[r]] if r in p2p else [])
        (tmp_path / f"nccl_trace_rank_{r}").write_bytes(pickle.dumps({**_nccl_dump(entries), "pg_config": config}))
    d = diagnose([tmp_path])
    assert {g.name: g.ranks for g in d.job.groups} == {"WORLD": [0, 1, 2], "sub": [2, 0]}
    ranks = d.job.report.ranks
    assert [(e.op, e.peer) for e in ranks[2].trace[1:]] == [("send", 0)]
    assert [(e.op, e.peer) for e in ranks[0].trace[1:]] == [("recv", 2)]
