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
