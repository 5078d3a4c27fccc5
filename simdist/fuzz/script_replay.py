"""How a script's counterexample is written down: the commands that replay it, and a small
shell file holding them.

A schedule of a script is its world size (torchrun-style scripts) and each rank's
DataLoader cap, so it replays with the ordinary commands: `simdist run SCRIPT
--nproc-per-node W --batches c0,c1,... -- ARGS` in the simulator, `simdist compare ...` (or
`simdist real ...`) with the same options on real Gloo. The file is those commands as a
shell script: `sh FILE` replays it in the simulator (exit 1: the failure reproduces),
`sh FILE compare` beside real Gloo, `sh FILE real` on real Gloo alone. It replays from any
folder and shell: it changes to the folder the search ran in (the script's path and
arguments are as the user gave them) and, where no `simdist` is on PATH (a virtual
environment not activated), runs the simdist that wrote it. Its name is stable (script,
failure kind, a hash of the schedule), so the same counterexample found twice is one file;
it is written aside and renamed, so it appears whole or not at all.
"""

from __future__ import annotations

import hashlib
import os
import re
import shlex
import sys
from dataclasses import dataclass
from pathlib import Path

from simdist.script.env import format_batches

STATES = {
    "shrunk": "shrunk: fewest ranks, then the smallest difference between caps, then the smallest caps.",
    "unshrunk": "NOT SHRUNK YET: written when first found; the search went on and replaces this file with the "
                "shrunk one when it ends.",
    "interrupted": "the search was interrupted (Ctrl-C): the smallest failing schedule found so far, perhaps not "
                   "minimal.",
}


@dataclass(frozen=True)
class Schedule:
    """One run of a script: its world size and each rank's cap (empty: no cap)."""

    world_size: int
    caps: tuple[int, ...]

    def size(self) -> tuple[int, int, int, tuple[int, ...]]:
        """What "smaller" means when shrinking: fewer ranks, then a smaller difference between
        the ranks' caps, then fewer batches in all."""
        spread = max(self.caps) - min(self.caps) if self.caps else 0
        return (self.world_size, spread, sum(self.caps), self.caps)

    def describe(self) -> str:
        caps = f", batches {format_batches(list(self.caps))}" if self.caps else ""
        return f"{self.world_size} rank{'s' if self.world_size != 1 else ''}{caps}"


def command(verb: str, script: str, args: tuple[str, ...], schedule: Schedule, torchrun: bool,
            backend: str | None = None) -> str:
    """The shell command that runs `schedule` with `simdist VERB` (run, real, compare)."""
    parts = ["simdist", verb, script]
    if torchrun:
        parts += ["--nproc-per-node", str(schedule.world_size)]
    if schedule.caps:
        parts += ["--batches", format_batches(list(schedule.caps))]
    if backend is not None and verb == "run":
        parts += ["--backend", backend]
    if args:
        parts += ["--", *args]
    return shlex.join(parts)


def _comment(text: str) -> str:
    """One comment line: control characters (a newline would end it) as spaces."""
    return "# " + re.sub(r"[\x00-\x1f\x7f]", " ", text)


def _safe(text: str, fallback: str) -> str:
    slug = re.sub(r"[^A-Za-z0-9._-]+", "-", text).strip("-._")[:60]
    return slug or fallback


def replay_path(out_dir: Path, script: str, args: tuple[str, ...], schedule: Schedule, kind: str) -> Path:
    digest = hashlib.sha256(repr((script, args, schedule.world_size, schedule.caps)).encode()).hexdigest()[:10]
    return out_dir / f"{_safe(Path(script).stem, 'script')}-{_safe(kind.replace(':', '-'), 'failure')}-{digest}.sh"


def write_replay(out_dir: Path, script: str, args: tuple[str, ...], schedule: Schedule, torchrun: bool,
                 backend: str | None, *, seed: int, key: str, summary: str, explanation: list[str],
                 state: str = "shrunk") -> Path:
    """Write the replay file of a failing schedule under `out_dir`; its path."""
    path = replay_path(out_dir, script, args, schedule, key.split("/")[0])
    sim = command("run", script, args, schedule, torchrun, backend)
    other = command("VERB", script, args, schedule, torchrun).replace("simdist VERB ", 'simdist "$1" ', 1)
    here, python = shlex.quote(os.getcwd()), shlex.quote(sys.executable)
    lines = [
        "#!/bin/sh",
        f"# simdist fuzz counterexample (seed {seed}) for {script}: {schedule.describe()}",
        f"# failure class: {key}: {summary}",
        f"# {STATES[state]}",
        "# sh THIS_FILE          replays it in the simulator (exit 1: the failure reproduces)",
        "# sh THIS_FILE compare  runs it in the simulator and on real Gloo and diffs them; sh THIS_FILE real: Gloo only",
        "#",
        *[_comment(line) for line in explanation],
        f"cd {here} || exit 2  # the folder simdist fuzz ran in: the script's path is relative to it",
        f"command -v simdist >/dev/null 2>&1 || simdist() {{ {python} -m simdist \"$@\"; }}  # the one that wrote this",
        f'if [ "${{1:-run}}" = run ]; then {sim}; exit; fi',
        other,
        "",
    ]
    out_dir.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(f".{path.name}.tmp")
    tmp.write_text("\n".join(lines), encoding="utf-8")
    os.replace(tmp, path)
    return path
