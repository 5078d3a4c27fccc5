"""The script fuzzer's pieces that need no process: schedules and their order, the candidates
of the greedy shrink, replay commands and files, option parsing (fast, no torch)."""

from __future__ import annotations

import shlex
import subprocess

import pytest

from simdist.cli.fuzz_script import _print, parse_range
from simdist.errors import ScriptError
from simdist.fuzz.script_replay import Schedule, command, replay_path, write_replay
from simdist.fuzz.scripts import Judged, ScriptCounterexample, ScriptFuzzer, ScriptFuzzResult, Space, Tick
from simdist.script.api import parse_caps
from simdist.script.env import parse_batches


def test_schedule_order_fewest_ranks_then_smallest_difference_then_fewest_batches():
    scheds = [Schedule(3, (1, 1, 2)), Schedule(2, (5, 7)), Schedule(2, (1, 3)), Schedule(2, (4, 5)),
              Schedule(2, (1, 2))]
    assert sorted(scheds, key=Schedule.size) == [Schedule(2, (1, 2)), Schedule(2, (4, 5)), Schedule(2, (1, 3)),
                                                 Schedule(2, (5, 7)), Schedule(3, (1, 1, 2))]
    assert Schedule(2, (1, 2)).describe() == "2 ranks, batches 1,2"
    assert Schedule(1, ()).describe() == "1 rank"


def test_replay_commands_quote_what_the_shell_would_split():
    s = Schedule(2, (1, 2))
    assert command("run", "examples/x.py", ("--epochs", "2"), s, True, "nccl") == \
        "simdist run examples/x.py --nproc-per-node 2 --batches 1,2 --backend nccl -- --epochs 2"
    assert command("compare", "my dir/x.py", ("--name", "a b"), s, False, "nccl") == \
        "simdist compare 'my dir/x.py' --batches 1,2 -- --name 'a b'"
    assert shlex.split(command("run", "my dir/x.py", (), Schedule(2, ()), True)) == \
        ["simdist", "run", "my dir/x.py", "--nproc-per-node", "2"]


def test_replay_file_runs_the_simulator_by_default_and_any_verb_on_request(tmp_path):
    s = Schedule(2, (1, 2))
    path = write_replay(tmp_path, "my dir/t.py", ("--lr", "0.1"), s, True, "gloo", seed=3, key="hang/hang",
                        summary="hang: hang", explanation=["rank 1 is blocked\nin all_reduce"])
    assert path.parent == tmp_path and path.name.startswith("t-hang-") and path.suffix == ".sh"
    text = path.read_text()
    assert "# rank 1 is blocked in all_reduce" in text  # a newline would end the comment
    assert not list(tmp_path.glob(".*.tmp"))
    # run it with a stand-in `simdist` that prints its arguments
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "simdist").write_text('#!/bin/sh\nfor a in "$@"; do echo "[$a]"; done\n')
    (fake / "simdist").chmod(0o755)
    env = {"PATH": f"{fake}:/usr/bin:/bin"}
    sim = subprocess.run(["sh", str(path)], capture_output=True, text=True, env=env).stdout.split()
    assert sim == ["[run]", "[my", "dir/t.py]", "[--nproc-per-node]", "[2]", "[--batches]", "[1,2]", "[--backend]",
                   "[gloo]", "[--]", "[--lr]", "[0.1]"]
    real = subprocess.run(["sh", str(path), "compare"], capture_output=True, text=True, env=env).stdout.split()
    assert real[:1] == ["[compare]"] and "[--backend]" not in real and real[-2:] == ["[--lr]", "[0.1]"]


def test_replay_file_replays_from_anywhere_with_the_simdist_that_wrote_it(tmp_path, monkeypatch):
    """No `simdist` on PATH (a virtual environment not activated), started from another
    folder: the file changes to the folder the search ran in and runs the writer's simdist."""
    fake = tmp_path / "python with space"
    fake.write_text('#!/bin/sh\necho "$PWD"\nfor a in "$@"; do echo "[$a]"; done\n')
    fake.chmod(0o755)
    searched = tmp_path / "search dir"
    searched.mkdir()
    monkeypatch.chdir(searched)
    monkeypatch.setattr("sys.executable", str(fake))
    path = write_replay(tmp_path / "o", "t.py", (), Schedule(2, (1, 2)), True, None, seed=0, key="hang/hang",
                        summary="", explanation=[])
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    for verb, want in ((), "[run]"), (("real",), "[real]"):
        res = subprocess.run(["sh", str(path), *verb], capture_output=True, text=True, cwd=elsewhere,
                             env={"PATH": "/usr/bin:/bin"})
        lines = res.stdout.splitlines()
        assert res.returncode == 0 and lines[0] == str(searched), res.stderr
        assert lines[1:4] == ["[-m]", "[simdist]", want] and lines[4] == "[t.py]"


def test_replay_names_stay_inside_the_output_folder(tmp_path):
    p = replay_path(tmp_path, "../../etc/pa ss\n.py", (), Schedule(2, (1, 2)), "invariant:x/../y")
    assert p.parent == tmp_path and "/" not in p.name and "\n" not in p.name and not p.name.startswith(".")


@pytest.mark.parametrize(("text", "want"), [("2:4", (2, 4)), ("3", (3, 3)), (" 1:1", (1, 1))])
def test_parse_range(text, want):
    assert parse_range(text, "--x", 1) == want


@pytest.mark.parametrize("text", ["0:2", "4:2", "a:b", "1:2:3", "", "-1:2"])
def test_parse_range_rejects_with_the_field_named(text):
    with pytest.raises(ScriptError, match="--x"):
        parse_range(text, "--x", 1)


def test_batches_caps_parse_and_count():
    assert parse_batches("5,6") == [5, 6] and parse_batches("0") == [0]
    assert parse_caps("3, 4", 2) == [3, 4] and parse_caps(5, 3) == [5] and parse_caps([1, 2], None) == [1, 2]
    for bad in ("5,,6", "-1", "x", "1.5"):
        with pytest.raises(ScriptError, match="batches"):
            parse_caps(bad, 2)
    with pytest.raises(ScriptError, match="3 caps given .* --nproc-per-node 2"):
        parse_caps("1,2,3", 2)


class _Scripted(ScriptFuzzer):
    """A fuzzer whose runs are a function of the schedule (no processes): fails when the caps differ."""

    def __init__(self, space: Space):
        super().__init__(space, None, ScriptFuzzResult("s.py", [], 0, 10, None, None))
        self.runs = 0

    def _execute(self, s: Schedule) -> Judged:
        self.runs += 1
        failed = len(set(s.caps)) > 1
        return Judged(failed, "hang/hang" if failed else "ok", "sig", "", [], list(s.caps))


def test_greedy_shrink_reaches_two_ranks_one_batch_apart():
    fz = _Scripted(Space("s.py", worlds=(2, 4), batches=(1, 8)))
    best = fz.greedy(Schedule(4, (8, 3, 6, 1)), "hang/hang")
    assert best.world_size == 2 and max(best.caps) - min(best.caps) == 1 and min(best.caps) == 1
    runs = fz.runs
    assert fz.greedy(Schedule(4, (8, 3, 6, 1)), "hang/hang") == best and fz.runs == runs  # cached


def test_greedy_shrink_keeps_the_world_of_a_script_that_starts_its_own_ranks():
    fz = _Scripted(Space("s.py", worlds=None, batches=(2, 6)))
    best = fz.greedy(Schedule(3, (6, 2, 5)), "hang/hang")
    assert best.world_size == 3 and sorted(best.caps) == [2, 2, 3]


def test_the_text_report_shows_every_line_of_the_explanation_the_hint_included(capsys):
    """The last line of a hang's explanation is usually the hint that says how to fix it: the
    text report must not cut it off (it did, after four lines)."""
    lines = ["rank 0 left: ...", "rank 1 is blocked in ...", "hang: ...", "backend nccl: ...",
             "hint (a rank finished while others wait): wrap the loop in Join([model, ...])"]
    res = ScriptFuzzResult("t.py", [], 0, 10, [2, 4], [1, 8], schedules=5, seconds=2.0, start_seconds=1.5)
    res.counterexamples.append(ScriptCounterexample("hang/hang", "hang/hang", "hang", 2, [1, 2], 4, lines,
                                                    "simdist run t.py", "simdist compare t.py"))
    _print(res, json_=False)
    out = capsys.readouterr().out
    assert all(line in out for line in lines)
    assert "2 ranks, batches per rank 1,2 (first seen at schedule 4)" in out
    assert "5 schedules in 2.0 s (1.5 s starting the fork server, then 10.0/s;" in out


def test_progress_text_names_the_phase_the_schedules_run_and_what_was_found():
    assert Tick(1, 0, "baseline", ()).describe() == "baseline run: 0 schedules run"
    assert Tick(2, 1, "generate", ()).describe() == "searching: 1 schedule run"
    assert Tick(9, 7, "shrink", ("hang/hang",)).describe() == "searching, shrinking: 7 schedules run; found hang/hang"
