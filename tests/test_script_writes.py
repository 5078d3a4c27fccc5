"""What `rank.writes` lists decides what `simdist compare` sets aside between its sides: a
path it misses leaks the first side's file into the second (a false difference), a folder it
lists that the side did not make claims another process's files below it."""

from __future__ import annotations

import os
import textwrap
import time

import pytest

from tests.test_script_examples import differences
from tests.test_script_workdir import compare_beside

LINKS = """
import os, time
import torch.distributed as dist
dist.init_process_group("gloo")
rank = dist.get_rank()
print("resumed" if os.path.lexists("latest") else "fresh")
dist.barrier()
if rank == 0:
    os.makedirs("logs", exist_ok=True)  # there already: another process's log is in it
    with open("started.txt", "w") as f:
        f.write("x")
    deadline = time.time() + 30
    while not os.path.exists(os.path.join("logs", "outside.log")) and time.time() < deadline:
        time.sleep(0.05)
    with open("ckpt-1.pt", "w") as f:
        f.write("w")
    os.symlink("ckpt-1.pt", "latest")  # FileExistsError where the side starts with it
dist.barrier()
"""


@pytest.mark.real
def test_a_link_the_side_made_is_set_aside_and_a_folder_it_only_reused_claims_nothing(
        script_zygote, tmp_path, monkeypatch):
    """The script links `latest` to its checkpoint (`os.symlink`, unlisted before: the link
    stayed, and the real side resumed and failed on `os.symlink` where the simulated one
    started fresh) and calls `os.makedirs("logs", exist_ok=True)` on a folder that exists,
    where another process (a thread of this test's) appends to its log and creates another:
    both are left as they are (before, `mkdir` listed `logs` though it made nothing, and
    every change below it was moved away as the side's)."""
    script = tmp_path / "train.py"
    script.write_text(textwrap.dedent(LINKS))
    (tmp_path / "logs").mkdir()
    (tmp_path / "logs" / "other.log").write_text("before\n")

    def outsider() -> None:
        deadline = time.time() + 60
        while not (tmp_path / "started.txt").exists() and time.time() < deadline:
            time.sleep(0.02)
        with open(tmp_path / "logs" / "other.log", "a") as f:
            f.write("another process\n")
        (tmp_path / "logs" / "outside.log").write_text("mine\n")

    monkeypatch.chdir(tmp_path)
    both = compare_beside(script, outsider, script_zygote)
    for side in (both.sim.report, both.real.report):
        assert [r.output for r in side.ranks] == [["fresh"]] * 2
    assert differences(both.sim.report, both.real.report) == []
    w = both.workdir.to_jsonable()
    assert [(c["path"], c["change"]) for c in w["changes"]] == [
        ("ckpt-1.pt", "created"), ("latest", "created"), ("started.txt", "created")]
    assert w["left_alone"] == [{"path": os.path.join("logs", "other.log"), "change": "modified"},
                               {"path": os.path.join("logs", "outside.log"), "change": "created"}]
    assert (tmp_path / "logs" / "other.log").read_text() == "before\nanother process\n"
    assert os.readlink(tmp_path / w["set_aside"] / "latest") == "ckpt-1.pt"


def _undo_wraps_after(monkeypatch) -> None:
    """Have monkeypatch put back every builtin `writes.install()` wraps, so the wrappers
    installed in this test process do not outlive the test."""
    import builtins
    import io

    for owner, names in ((builtins, ("open",)), (io, ("open",)), (os, (
            "open", "remove", "unlink", "rmdir", "mkdir", "truncate", "rename", "replace", "utime", "mkfifo",
            "mknod", "symlink", "link"))):
        for name in names:
            monkeypatch.setattr(owner, name, getattr(owner, name))


def test_links_touches_and_jit_saves_are_listed_and_a_folder_mkdir_did_not_make_is_not(tmp_path, monkeypatch):
    """`os.symlink`/`link` (`Path.symlink_to`, `hardlink_to`), `os.utime` (`Path.touch` of a
    file that exists), `os.mkfifo` and `torch.jit.save` (C++) list the path they change;
    `os.mkdir` lists a folder only when it made it (`exist_ok=True` on one that exists does not)."""

    import torch
    import torch.jit._script

    from simdist.script import env
    from simdist.script.rank import writes

    run, work = tmp_path / "run", tmp_path / "work"
    run.mkdir()
    work.mkdir()
    (work / "kept").mkdir()
    (work / "old.txt").write_text("o")
    monkeypatch.setenv(env.SOCKET, str(run / "coordinator.sock"))
    monkeypatch.chdir(work)
    _undo_wraps_after(monkeypatch)
    monkeypatch.setattr(torch.jit._script.RecursiveScriptModule, "save", torch.jit._script.RecursiveScriptModule.save)
    monkeypatch.setattr(writes, "_seen", set())
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: None)
    writes.install()
    writes.install_jit(torch.jit._script)
    os.makedirs("kept", exist_ok=True)
    (work / "kept").mkdir(exist_ok=True)
    os.makedirs("new/sub", exist_ok=True)
    (work / "latest").symlink_to("old.txt")
    (work / "hard").hardlink_to("old.txt")
    (work / "old.txt").touch()
    os.mkfifo("fifo")
    torch.jit.save(torch.jit.script(torch.nn.Linear(2, 2)), "model.jit")
    names = {os.path.relpath(p, work) for p in env.written(str(run))}
    assert names == {"new", "new/sub", "latest", "hard", "old.txt", "fifo", "model.jit"}, names


def test_a_wrapped_call_held_as_a_class_attribute_binds_no_instance(tmp_path, monkeypatch):
    """`opener = open` in a class body, called as `self.opener(path, "w")`: the builtin never
    binds, so it gets the path; the wrapper is a plain function no more (it got the instance
    as its path: TypeError on the simulated side only). The write is still listed."""

    from simdist.script import env
    from simdist.script.rank import writes

    run, work = tmp_path / "run", tmp_path / "work"
    run.mkdir()
    work.mkdir()
    monkeypatch.setenv(env.SOCKET, str(run / "coordinator.sock"))
    monkeypatch.chdir(work)
    _undo_wraps_after(monkeypatch)
    monkeypatch.setattr(writes, "_seen", set())
    monkeypatch.setattr(os, "register_at_fork", lambda **kw: None)
    writes.install()

    class Saver:
        opener = open
        remover = os.remove

        def save(self, path: str) -> None:
            with self.opener(path, "w") as f:
                f.write("x")

    Saver().save("a.txt")
    Saver().remover("a.txt")
    assert not (work / "a.txt").exists()
    assert {os.path.relpath(p, work) for p in env.written(str(run))} == {"a.txt"}
