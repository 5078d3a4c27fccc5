"""docs/layout.md is the module map a newcomer reads: it must list every module as it is."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_layout_doc_is_current_and_every_module_says_what_it_is():
    done = subprocess.run(
        [sys.executable, str(ROOT / "docs" / "make_layout.py"), "--check"],
        capture_output=True, text=True, timeout=60,
    )
    assert done.returncode == 0, done.stdout + done.stderr
