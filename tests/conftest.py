"""Shared test helpers."""

from __future__ import annotations

import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parent.parent
SCENARIOS = ROOT / "scenarios"


def run_cli(*args: str, timeout: float = 120):
    """Run the real `simdist` CLI in a subprocess (as users do) and return the CompletedProcess."""
    import subprocess

    return subprocess.run([sys.executable, "-m", "simdist", *args], capture_output=True, text=True,
                          timeout=timeout, cwd=ROOT)


@pytest.fixture
def tmp_scenario(tmp_path):
    def write(text: str, name: str = "s.toml") -> Path:
        p = tmp_path / name
        p.write_text(text)
        return p

    return write


EXAMPLES = ROOT / "examples"


def line_of(path: Path, text: str, after: str | None = None) -> int:
    """1-based number of the first line of `path` containing `text` (after the line containing `after`)."""
    lines = path.read_text().splitlines()
    start = next(i for i, line in enumerate(lines) if after in line) if after else 0
    return next(i for i, line in enumerate(lines) if i >= start and text in line) + 1


def trace_keys(trace) -> list[tuple]:
    """What a script's trace and a scenario's simulated trace are compared on, per entry."""
    return [(e.seq, e.op, e.numel, e.dtype, e.group, e.origin, e.reduce_op, e.root) for e in trace]
