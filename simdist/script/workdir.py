"""Both sides of `simdist compare` start from the same working directory.

A script's ranks run in simdist's working directory, and scripts write there: checkpoints
they resume from when they exist (pytorch/examples' DDP series saves `snapshot.pt`), logs
they append to. `compare` runs the simulated side, then the real one, in that directory, so
without this the real side would start from what the simulated side wrote, and the
comparison would report a difference of the files, not of the model.

Before the first side, `record` lists the directory (breadth first, at most `MAX_ENTRIES`
entries; not `.simdist/`, `.git/`, `__pycache__/`, tool caches (`SKIPPED`) or a virtual environment, which a
script's behaviour does not depend on, nor a file simdist's own output goes to) and copies its small regular files
(`BACKUP_FILE_BYTES` each, `BACKUP_BYTES` in all) to a temporary folder. After it, `set_aside` compares the
directory with that record, and keeps the changes the first side's processes made (the paths
they wrote, created, renamed or deleted: `rank.writes` lists them, `set_aside`'s `written`);
a change nothing of the side made (another process writing in the folder meanwhile: an
editor, a log of another program's) is left as it is, and the report names it:

* what the side created moves (a rename: no copy) to `.simdist/compare/<stamp>/sim/`,
  under the same relative path (a created folder moves whole);
* a file it modified moves there too, and the original comes back from the backup; one it
  deleted comes back from the backup;
* a modified or deleted file too large to have been backed up cannot come back: the side's
  version (if any) is copied there and the second side starts from it, a warning line
  naming the file says so.

A change to a Python source that was there before (`SOURCES`: the script, its modules) is left
alone: a training run does not rewrite its own code, so such a change is the user's edit made
while the command ran (or a test's while the suite runs from a checkout), and putting the old
version back would silently undo it in the working copy (measured: edits to a checkout's
`simdist/*.py` were moved to `.simdist/compare/` by tests that ran compare from the checkout).

Nothing either side wrote is lost: the first side's files are in the set-aside folder, the
second side's stay where it wrote them (as after a real run). Nothing is created when the
first side wrote nothing; then the cost is two listings of the directory and the backup copy.

Why not run each side in a copy of the folder, so that nothing needs putting back: a script
reads and prints its own paths (`__file__`, `os.getcwd()`, absolute checkpoint paths in its
arguments), which would then differ between the sides and from the user's run, and a copy
costs the whole folder (datasets included) where this costs what the side wrote.
"""

from __future__ import annotations

import os
import shutil
import stat
import tempfile
import time
import uuid
from collections import deque
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

MAX_ENTRIES = 20_000  # entries listed (breadth first); deeper ones are not tracked, and the report says so
BACKUP_FILE_BYTES = 4 << 20  # a pre-existing file up to this size is copied before the first side
BACKUP_BYTES = 32 << 20  # ... while the copies total at most this
BACKUP_FILES = 2_000  # ... and number at most this (smallest first)
# not tracked: ours, VCS data, bytecode and tool caches (a test runner's, a linter's: written by
# whatever else runs in the folder meanwhile, never read by a training script)
SKIPPED = frozenset({".simdist", ".git", "__pycache__", ".pytest_cache", ".ruff_cache", ".mypy_cache", ".hypothesis"})
SOURCES = frozenset({".py"})  # a pre-existing file of these suffixes that changed is the user's edit: left alone
VENV_MARK = "pyvenv.cfg"  # a folder holding it is a virtual environment: not tracked either
SET_ASIDE_DIR = Path(".simdist") / "compare"

CREATED, MODIFIED, DELETED = "created", "modified", "deleted"


@dataclass(frozen=True)
class Entry:
    """What tells a changed entry from an unchanged one (a rename over it changes the inode)."""

    kind: str  # "dir", "file" or "other" (links are "other": never followed)
    size: int
    mtime_ns: int
    ino: int


@dataclass
class Record:
    """The working directory before the first side: its entries by relative path, the
    folders listed, and the backups of small files (in `backup`, a temporary folder)."""

    root: Path
    own: frozenset[tuple[int, int]] = frozenset()  # (device, inode) of simdist's stdin/stdout/stderr
    entries: dict[str, Entry] = field(default_factory=dict)
    listed: list[str] = field(default_factory=list)
    truncated: bool = False
    backup: Path | None = None
    backed_up: set[str] = field(default_factory=set)

    def discard(self) -> None:
        if self.backup is not None:
            shutil.rmtree(self.backup, ignore_errors=True)
            self.backup = None


@dataclass
class Change:
    """One entry the first side changed: `moved_to` where its version now is (None: it
    deleted it), `restored` whether the original is back for the second side."""

    path: str
    change: str
    moved_to: str | None
    restored: bool


@dataclass
class SetAside:
    """What `set_aside` did, for the report (text lines and JSON)."""

    folder: str | None = None
    changes: list[Change] = field(default_factory=list)
    truncated: bool = False
    left: list[tuple[str, str]] = field(default_factory=list)  # (path, change) no process of the side made

    def lines(self, first: str = "simulated", second: str = "real") -> list[str]:
        """One line per file, naming it; none when the first side changed nothing."""
        out = [f"working directory: the {first} side's files moved to {self.folder}; the {second} side "
               f"started from the files as they were"] if self.changes else []
        for c in self.changes:
            if c.restored or c.change == CREATED:
                out.append(f"  {c.path}: {c.change} by the {first} side" + (
                    f", its version in {c.moved_to}" if c.moved_to else "") + ("; original restored" if c.restored
                                                                                else ""))
            else:
                out.append(f"  warning: {c.path}: {c.change} by the {first} side and not backed up (over "
                           f"{BACKUP_FILE_BYTES >> 20} MiB, past the backups' bounds, or not a regular file): the "
                           f"{second} side started from the changed state" +
                           (f" (a copy is in {c.moved_to})" if c.moved_to else ""))
        if self.left:
            out.append(f"working directory: changed while the {first} side ran, but not by its processes "
                       f"(left as they are):")
            out.extend(f"  {path}: {change}" for path, change in self.left)
        if self.truncated:
            out.append(f"working directory: more than {MAX_ENTRIES:,} entries; changes below the first "
                       f"{MAX_ENTRIES:,} (breadth first) were not set aside")
        return out

    def to_jsonable(self) -> dict[str, Any]:
        return {"set_aside": self.folder, "truncated": self.truncated,
                "changes": [{"path": c.path, "change": c.change, "moved_to": c.moved_to, "restored": c.restored}
                            for c in self.changes],
                "left_alone": [{"path": path, "change": change} for path, change in self.left]}


def _entry(st: os.stat_result) -> Entry:
    kind = "dir" if stat.S_ISDIR(st.st_mode) else "file" if stat.S_ISREG(st.st_mode) else "other"
    return Entry(kind, st.st_size, st.st_mtime_ns, st.st_ino)


def _own_files() -> frozenset[tuple[int, int]]:
    """simdist's standard streams: a file in the folder that they write to (`simdist compare
    x.py > log.txt`: the ranks' output too) is the user's record of the command, never moved."""
    own = set()
    for fd in (0, 1, 2):
        try:
            st = os.fstat(fd)
        except OSError:
            continue
        if stat.S_ISREG(st.st_mode):
            own.add((st.st_dev, st.st_ino))
    return frozenset(own)


def _list(rec: Record, rel: str) -> dict[str, Entry]:
    """The entries of folder `rel` (not following links) but our own streams' files; an
    unreadable folder has none."""
    out: dict[str, Entry] = {}
    if rel and (rec.root / rel / VENV_MARK).exists():
        return out
    try:
        with os.scandir(rec.root / rel) as it:
            for d in it:
                if d.name in SKIPPED:
                    continue
                try:
                    st = d.stat(follow_symlinks=False)
                except OSError:
                    continue
                if (st.st_dev, st.st_ino) not in rec.own:
                    out[os.path.join(rel, d.name) if rel else d.name] = _entry(st)
    except OSError:
        pass
    return out


def record(root: str | os.PathLike | None = None) -> Record:
    """List the working directory (`root`, default the current one) and back up its small files."""
    rec = Record(Path(root) if root is not None else Path.cwd(), _own_files())
    todo = deque([""])
    while todo:
        rel = todo.popleft()
        if len(rec.entries) >= MAX_ENTRIES:
            rec.truncated = True
            break
        rec.listed.append(rel)
        for path, e in _list(rec, rel).items():
            rec.entries[path] = e
            if e.kind == "dir":
                todo.append(path)
    _backup(rec)
    return rec


def _backup(rec: Record) -> None:
    small = [(p, e) for p, e in rec.entries.items() if e.kind == "file" and e.size <= BACKUP_FILE_BYTES]
    if not small:
        return
    rec.backup = Path(tempfile.mkdtemp(prefix="simdist-workdir-"))
    total = 0
    for p, e in sorted(small, key=lambda pe: pe[1].size)[:BACKUP_FILES]:
        if total + e.size > BACKUP_BYTES:
            break
        try:
            (rec.backup / p).parent.mkdir(parents=True, exist_ok=True)
            shutil.copy2(rec.root / p, rec.backup / p)
        except OSError:
            continue
        total += e.size
        rec.backed_up.add(p)


def _changes(rec: Record) -> list[tuple[str, str]]:
    """(path, change) for what differs from the record, in the folders it listed; a created
    folder is one change (its contents move with it)."""
    listed, out = set(rec.listed), []
    for rel in rec.listed:
        now = _list(rec, rel)
        for p, e in now.items():
            was = rec.entries.get(p)
            if was is None:
                out.append((p, CREATED))
            elif _source(p, was):
                continue
            elif was.kind != e.kind:
                out.append((p, MODIFIED))
            elif e.kind != "dir" and e != was:
                out.append((p, MODIFIED))
        for p, was in rec.entries.items():
            if os.path.dirname(p) == rel and p not in now and (was.kind != "dir" or p in listed) and not _source(p, was):
                out.append((p, DELETED))
    return sorted(out)


def _source(path: str, was: Entry) -> bool:
    """`path` was a Python source before the first side: not the run's output (`SOURCES`)."""
    return was.kind == "file" and os.path.splitext(path)[1] in SOURCES


def claimed(root: Path, written: Iterable[str]) -> Callable[[str], bool]:
    """Whether a changed path (relative to `root`) is the side's: its processes wrote it, or a
    folder above it (one they created, renamed or removed), or a path inside it (a folder they
    created: it moves whole). `written`: absolute paths (`rank.writes`), their folders resolved
    as `root` is (a link in either names the same file), the name itself not (a link it wrote)."""
    base = os.path.realpath(root)
    wrote: set[str] = set()
    for w in written:
        rel = os.path.relpath(os.path.join(os.path.realpath(os.path.dirname(w)), os.path.basename(w)), base)
        if rel != os.curdir and rel != os.pardir and not rel.startswith(os.pardir + os.sep):
            wrote.add(rel)
    holding = {os.path.dirname(p) for p in wrote}  # folders with something the side wrote inside
    for p in list(holding):
        while p:
            holding.add(p)
            p = os.path.dirname(p)

    def is_mine(path: str) -> bool:
        if path in holding:
            return True
        while path:
            if path in wrote:
                return True
            path = os.path.dirname(path)
        return False
    return is_mine


def set_aside(rec: Record, side: str = "sim", stamp: str | None = None,
              written: Iterable[str] | None = None) -> SetAside:
    """Move what the first side wrote under `.simdist/compare/<stamp>/<side>/` (relative to the
    recorded folder; `stamp` unique by default: no earlier compare's files are overwritten) and put back
    what it changed (see the module's docstring); the backup is discarded. `written`: the paths
    the side's processes wrote (`ScriptRun.written`); a change to any other path is left where
    it is (another process's: an editor's save, a log something else appends to) and named in
    `SetAside.left`. None: every change is the side's."""
    try:
        changes = _changes(rec)
        left: list[tuple[str, str]] = []
        if written is not None:
            is_mine = claimed(rec.root, written)
            left = [(p, c) for p, c in changes if not is_mine(p)]
            changes = [(p, c) for p, c in changes if is_mine(p)]
        folder = SET_ASIDE_DIR / (stamp or f"{time.strftime('%Y%m%d-%H%M%S')}-{uuid.uuid4().hex[:6]}") / side
        out = SetAside(str(folder) if changes else None, truncated=rec.truncated, left=left)
        for path, change in changes:
            if any(path.startswith(c.path + os.sep) for c in out.changes if c.change == CREATED):
                continue  # inside a created folder that moved whole
            out.changes.append(_put_back(rec, path, change, folder))
        return out
    finally:
        rec.discard()


def _put_back(rec: Record, path: str, change: str, folder: Path) -> Change:
    src, dst = rec.root / path, rec.root / folder / path
    was = rec.entries.get(path)
    if change == DELETED and was is not None and was.kind == "dir":
        src.mkdir(parents=True, exist_ok=True)  # its backed-up files come back one by one
        return Change(path, change, None, True)
    restorable = path in rec.backed_up
    moved = None
    if change != DELETED:
        dst.parent.mkdir(parents=True, exist_ok=True)
        if restorable or change == CREATED:
            os.replace(src, dst)
        elif src.is_dir() and not src.is_symlink():
            shutil.copytree(src, dst, symlinks=True)
        else:
            shutil.copy2(src, dst, follow_symlinks=False)  # the second side starts from it: keep a copy
        moved = str(folder / path)
    if restorable:
        src.parent.mkdir(parents=True, exist_ok=True)
        shutil.copy2(rec.backup / path, src)  # type: ignore[operator]
    return Change(path, change, moved, restorable)
