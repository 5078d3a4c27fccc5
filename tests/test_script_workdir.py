"""`simdist compare` runs both sides from the same files (`simdist.script.workdir`): what the
simulated side wrote in the working directory is set aside, and what it changed is put back,
before the real side starts; the report says what moved where, and nothing is lost."""

from __future__ import annotations

import os
import textwrap
import threading
import time

import pytest

from simdist.script import workdir
from simdist.script.api import compare_script
from tests.conftest import descendants
from tests.test_script_examples import differences

RESUMING = """
import os, torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
resumed = os.path.exists("ckpt/state.txt")  # as the DDP tutorial series resumes from snapshot.pt
with open("log.txt") as f:
    seen = len(f.read().splitlines())
t = torch.ones(1) * (rank + 1)
dist.all_reduce(t)
if resumed:
    dist.all_reduce(t)  # a resumed run runs another collective
print("resumed" if resumed else "fresh", seen, t.item())
dist.barrier()
if rank == 0:
    os.makedirs("ckpt", exist_ok=True)
    with open("ckpt/state.txt", "w") as f:
        f.write(str(t.item()))
    with open("log.txt", "a") as f:
        f.write("one more run\\n")
    os.remove("scratch.txt")
dist.barrier()
"""


@pytest.mark.real
def test_compare_starts_both_sides_from_the_same_files(script_zygote, tmp_path, monkeypatch):
    """A script that resumes from a checkpoint it writes, appends to a log and deletes a file:
    before, the real side started from the simulated side's checkpoint and differed. Now both
    print "fresh", the simulated side's files are where the report says, the log and the
    deleted file are back for the real side, and the real side's files are left in place."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(RESUMING))
    (tmp_path / "log.txt").write_text("first\n")
    (tmp_path / "scratch.txt").write_text("x")
    monkeypatch.chdir(tmp_path)  # forked ranks run in the launcher's working directory
    both = compare_script(script, nproc_per_node=2, backend="gloo", timeout_s=300, measure_compute=False,
                          zygotes=script_zygote)
    assert descendants(script_zygote("sim").pid) == descendants(script_zygote("gloo").pid) == []
    for side in (both.sim.report, both.real.report):
        assert [r.output for r in side.ranks] == [["fresh 1 3.0"]] * 2
    assert differences(both.sim.report, both.real.report) == []
    w = both.workdir.to_jsonable()
    folder = w["set_aside"]
    assert folder.startswith(".simdist/compare/") and folder.endswith("/sim")
    assert [(c["path"], c["change"], c["restored"]) for c in w["changes"]] == [
        ("ckpt", "created", False), ("log.txt", "modified", True), ("scratch.txt", "deleted", True)]
    assert (tmp_path / folder / "ckpt" / "state.txt").read_text() == "3.0"  # the simulated side's, kept
    assert (tmp_path / folder / "log.txt").read_text() == "first\none more run\n"
    assert (tmp_path / "ckpt" / "state.txt").read_text() == "3.0"  # the real side's, in place
    assert (tmp_path / "log.txt").read_text() == "first\none more run\n"  # appended once: by the real side
    assert not (tmp_path / "scratch.txt").exists()  # the real side deleted it too
    lines = both.workdir.lines()
    assert lines[0] == (f"working directory: the simulated side's files moved to {folder}; the real side started "
                        f"from the files as they were")
    assert lines[1:] == [f"  ckpt: created by the simulated side, its version in {folder}/ckpt",
                         f"  log.txt: modified by the simulated side, its version in {folder}/log.txt; original "
                         f"restored", "  scratch.txt: deleted by the simulated side; original restored"]


# ---------------------------------------------------------------- the mechanism alone (no process)
def test_nothing_written_moves_nothing_and_creates_nothing(tmp_path):
    (tmp_path / "a").mkdir()
    (tmp_path / "a" / "f.txt").write_text("x")
    rec = workdir.record(tmp_path)
    backup = rec.backup
    assert rec.backed_up == {os.path.join("a", "f.txt")} and backup is not None and backup.is_dir()
    moved = workdir.set_aside(rec)
    assert moved.to_jsonable() == {"set_aside": None, "truncated": False, "changes": [], "left_alone": []}
    assert moved.lines() == []
    assert sorted(p.name for p in tmp_path.iterdir()) == ["a"] and not backup.exists()


def test_a_file_too_large_to_back_up_is_named_and_its_changed_version_kept(tmp_path, monkeypatch):
    monkeypatch.setattr(workdir, "BACKUP_FILE_BYTES", 3)
    (tmp_path / "big.bin").write_bytes(b"1234")
    (tmp_path / "small.txt").write_text("ab")
    rec = workdir.record(tmp_path)
    assert rec.backed_up == {"small.txt"}
    (tmp_path / "big.bin").write_bytes(b"changed")
    (tmp_path / "small.txt").unlink()
    (tmp_path / "new" / "deep").mkdir(parents=True)
    (tmp_path / "new" / "deep" / "x").write_text("x")
    (tmp_path / "__pycache__").mkdir()  # not tracked: not moved
    moved = workdir.set_aside(rec, stamp="s")
    folder = os.path.join(".simdist", "compare", "s", "sim")
    assert moved.folder == folder
    assert (tmp_path / "big.bin").read_bytes() == b"changed" == (tmp_path / folder / "big.bin").read_bytes()
    assert (tmp_path / "small.txt").read_text() == "ab"
    assert (tmp_path / folder / "new" / "deep" / "x").read_text() == "x" and not (tmp_path / "new").exists()
    assert (tmp_path / "__pycache__").is_dir()
    warning = moved.lines()[1]
    assert warning.startswith("  warning: big.bin: modified by the simulated side and not backed up (over 0 MiB")
    assert warning.endswith(f"the real side started from the changed state (a copy is in {folder}/big.bin)")


def test_a_directory_past_the_entry_bound_is_not_tracked_and_the_report_says_so(tmp_path, monkeypatch):
    monkeypatch.setattr(workdir, "MAX_ENTRIES", 2)
    for d in ("a", "b"):
        (tmp_path / d).mkdir()
    rec = workdir.record(tmp_path)
    assert rec.truncated and rec.listed == [""]
    (tmp_path / "a" / "inside").write_text("not tracked")
    (tmp_path / "top").write_text("tracked")
    moved = workdir.set_aside(rec, stamp="t")
    assert [c.path for c in moved.changes] == ["top"] and (tmp_path / "a" / "inside").exists()
    assert moved.lines()[-1] == ("working directory: more than 2 entries; changes below the first 2 (breadth "
                                 "first) were not set aside")


def test_the_file_simdists_output_goes_to_is_left_alone(tmp_path):
    """`simdist compare x.py > log.txt` in the folder: the ranks' output reaches log.txt through
    simdist's stdout; moving it aside would send the rest of the output into the set-aside copy."""
    log = tmp_path / "log.txt"
    log.write_text("")
    saved = os.dup(1)
    try:
        with open(log, "a") as f:
            os.dup2(f.fileno(), 1)
        rec = workdir.record(tmp_path)
        os.write(1, b"a rank's line\n")
        (tmp_path / "ckpt").write_text("x")
        moved = workdir.set_aside(rec, stamp="o")
        os.write(1, b"the report\n")
    finally:
        os.dup2(saved, 1)
        os.close(saved)
    assert [c.path for c in moved.changes] == ["ckpt"]
    assert log.read_text() == "a rank's line\nthe report\n"


def test_an_edit_to_a_source_and_tool_caches_are_left_alone(tmp_path):
    """While the simulated side runs, the user edits train.py (a pre-existing source) and a test
    runner writes its cache: neither is the run's output, so neither moves nor is put back
    (before, the edit was moved to .simdist/compare/ and the old train.py restored)."""
    (tmp_path / "train.py").write_text("old\n")
    (tmp_path / "lib.py").write_text("x = 1\n")
    (tmp_path / "log.txt").write_text("old\n")
    rec = workdir.record(tmp_path)
    (tmp_path / "train.py").write_text("the user's edit\n")
    (tmp_path / "lib.py").unlink()
    (tmp_path / ".pytest_cache").mkdir()
    (tmp_path / ".pytest_cache" / "v").write_text("cache")
    (tmp_path / "gen.py").write_text("made by the run\n")  # created: the run's, moved as before
    (tmp_path / "log.txt").write_text("appended by the run\n")  # not a source: put back as before
    moved = workdir.set_aside(rec, stamp="s")
    assert [(c.path, c.change) for c in moved.changes] == [("gen.py", workdir.CREATED), ("log.txt", workdir.MODIFIED)]
    assert (tmp_path / "train.py").read_text() == "the user's edit\n" and not (tmp_path / "lib.py").exists()
    assert (tmp_path / ".pytest_cache" / "v").exists() and (tmp_path / "log.txt").read_text() == "old\n"


OUTSIDE = """
import os, time, torch
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
resumed = os.path.exists("ckpt.pt")  # torch.save writes it in C++ (its zip writer)
print("resumed" if resumed else "fresh", torch.load("ckpt.pt")["w"].tolist() if resumed else "")
if rank == 0:
    with open("started.txt", "w") as f:
        f.write("x")
    deadline = time.time() + 30
    while not os.path.exists("outside.log") and time.time() < deadline:  # another process's write comes
        time.sleep(0.05)
dist.barrier()
if rank == 0:
    torch.save({"w": torch.ones(2)}, "ckpt.pt")
dist.barrier()
"""


@pytest.mark.real
def test_compare_sets_aside_only_what_the_first_sides_processes_wrote(script_zygote, tmp_path, monkeypatch):
    """While the simulated side runs, another process (a thread of this test's, no rank)
    creates outside.log and appends to the pre-existing other.log: both stay as it left them,
    and the report names them as not the side's. Before, both were set aside and other.log
    put back (two helpers lost their logs so). The checkpoint the script writes with
    `torch.save` (opened in C++) on the simulated side is still set aside: the real side
    starts fresh as well."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(OUTSIDE))
    (tmp_path / "other.log").write_text("before\n")

    def outsider() -> None:
        deadline = time.time() + 60
        while not (tmp_path / "started.txt").exists() and time.time() < deadline:
            time.sleep(0.02)
        with open(tmp_path / "other.log", "a") as f:
            f.write("another process\n")
        (tmp_path / "outside.log").write_text("mine\n")

    monkeypatch.chdir(tmp_path)
    both = compare_beside(script, outsider, script_zygote)
    for side in (both.sim.report, both.real.report):
        assert [r.output for r in side.ranks] == [["fresh "]] * 2
    assert differences(both.sim.report, both.real.report) == []
    w = both.workdir.to_jsonable()
    assert [(c["path"], c["change"]) for c in w["changes"]] == [("ckpt.pt", "created"), ("started.txt", "created")]
    assert w["left_alone"] == [{"path": "other.log", "change": "modified"}, {"path": "outside.log", "change": "created"}]
    assert (tmp_path / "other.log").read_text() == "before\nanother process\n"
    assert (tmp_path / "outside.log").read_text() == "mine\n"
    assert (tmp_path / w["set_aside"] / "ckpt.pt").is_file() and (tmp_path / "ckpt.pt").is_file()
    assert both.workdir.lines()[-3:] == [
        "working directory: changed while the simulated side ran, but not by its processes (left as they are):",
        "  other.log: modified", "  outside.log: created"]


def test_only_the_changes_the_side_wrote_are_set_aside(tmp_path):
    """`set_aside(..., written=)`: a change is the side's when it wrote the path, a folder
    above it, or a path inside it (a created folder); the rest is left as it is and named.
    The folder is recorded through a link and the paths written name it resolved."""
    real = tmp_path / "real"
    real.mkdir()
    (tmp_path / "link").symlink_to(real)
    for name in ("ours.log", "theirs.log"):
        (real / name).write_text("old\n")
    rec = workdir.record(tmp_path / "link")
    (real / "ours.log").write_text("the side's\n")
    (real / "theirs.log").write_text("another's\n")
    (real / "ckpt" / "step1").mkdir(parents=True)
    (real / "ckpt" / "step1" / "model.pt").write_text("w")
    (real / "other").mkdir()
    (real / "other" / "x").write_text("x")
    written = [str(real / "ours.log"), str(real / "ckpt" / "step1" / "model.pt"), "/elsewhere/file",
               str(tmp_path / "outside-the-folder")]
    moved = workdir.set_aside(rec, stamp="w", written=written)
    assert [(c.path, c.change, c.restored) for c in moved.changes] == [
        ("ckpt", workdir.CREATED, False), ("ours.log", workdir.MODIFIED, True)]
    assert moved.left == [("other", workdir.CREATED), ("theirs.log", workdir.MODIFIED)]
    assert (real / "ours.log").read_text() == "old\n" and (real / "theirs.log").read_text() == "another's\n"
    assert (real / "other" / "x").exists() and not (real / "ckpt").exists()


def test_a_ranks_writes_are_listed_whichever_call_made_them(tmp_path, monkeypatch):
    """`rank.writes` lists what the process wrote through each Python-level call a write takes
    (open, pathlib, os.makedirs, os.replace, os.remove, shutil.rmtree, numpy.save, torch.save's
    C++ writer) and not what it only read; a forked child lists its own."""
    import builtins
    import io
    import shutil

    import numpy as np
    import torch
    import torch.serialization

    from simdist.script import env
    from simdist.script.rank import writes

    run = tmp_path / "run"
    run.mkdir()
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.setenv(env.SOCKET, str(run / "coordinator.sock"))
    monkeypatch.chdir(work)
    for owner, names in ((builtins, ("open",)), (io, ("open",)), (shutil, ("rmtree",)),
                         (os, ("open", "remove", "unlink", "rmdir", "mkdir", "truncate", "rename", "replace"))):
        for name in names:
            monkeypatch.setattr(owner, name, getattr(owner, name))
    cls = torch.serialization._open_zipfile_writer_file
    monkeypatch.setattr(cls, "__init__", cls.__init__)
    monkeypatch.setattr(writes, "_seen", set())
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: None)  # (the test's process keeps no handler)
    (work / "read.txt").write_bytes(b"r")
    writes.install()
    writes.install_torch(torch.serialization)
    with open("read.txt") as f:
        f.read()
    with open("a.txt", "w") as f:
        f.write("a")
    (work / "b.txt").write_text("b")
    os.makedirs("d/e")
    os.replace("a.txt", "d/a.txt")
    os.remove("b.txt")
    np.save("n.npy", np.zeros(2))
    torch.save({"w": torch.ones(1)}, "t.pt")
    shutil.rmtree("d")
    pid = os.fork()
    if pid == 0:
        writes._forget_after_fork()
        (work / "child.txt").write_text("c")
        os._exit(0)
    os.waitpid(pid, 0)
    names = {os.path.relpath(p, work) for p in env.written(str(run))}
    assert names == {"a.txt", "b.txt", "d", "d/e", "d/a.txt", "n.npy", "t.pt", "child.txt"}, names
    assert len(list(run.glob("writes-*.txt"))) == 2


def compare_beside(script, outsider, zygotes):
    """`compare_script` of `script` on 2 ranks while `outsider` writes in the folder from a
    thread of this process: what another process writes meanwhile is no side's to set aside."""
    t = threading.Thread(target=outsider)
    t.start()
    try:
        return compare_script(script, nproc_per_node=2, backend="gloo", timeout_s=300, measure_compute=False,
                              zygotes=zygotes)
    finally:
        t.join()
