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


MAX_MODULE_LINES = 450
MAX_FUNCTION_LINES = 80
WHY_LONG = "# long:"  # on one of the 3 lines above a longer function's `def`: why it stays whole


def _sizes() -> list[str]:
    """Modules over MAX_MODULE_LINES; functions over MAX_FUNCTION_LINES without a WHY_LONG comment."""
    import ast

    over = []
    for package in ("simdist", "real_backend"):
        for path in sorted((ROOT / package).rglob("*.py")):
            lines = path.read_text(encoding="utf-8").splitlines()
            rel = path.relative_to(ROOT)
            if len(lines) > MAX_MODULE_LINES:
                over.append(f"{rel}: {len(lines)} lines (at most {MAX_MODULE_LINES})")
            for node in ast.walk(ast.parse("\n".join(lines), str(rel))):
                if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                    n = node.end_lineno - node.lineno + 1
                    first = min([node.lineno] + [d.lineno for d in node.decorator_list])
                    why = any(WHY_LONG in line for line in lines[max(0, first - 4):first - 1])
                    if n > MAX_FUNCTION_LINES and not why:
                        over.append(f"{rel}:{node.lineno} {node.name}: {n} lines (at most {MAX_FUNCTION_LINES}, "
                                    f"or a '{WHY_LONG} ...' comment above it saying why)")
    return over


def test_modules_and_functions_are_small():
    """The house rule (docs/layout.md's modules stay readable): a module of at most 450 lines, a
    function of at most 80 unless a comment says why."""
    assert _sizes() == []


def test_ci_runs_exactly_the_readmes_test_command():
    """.ci/run is what CI runs and the README tells a contributor to run: the same line."""
    ci = [ln for ln in (ROOT / ".ci" / "run").read_text().splitlines() if ln.startswith("bash setup.sh")]
    readme = [ln.strip() for ln in (ROOT / "README.md").read_text().splitlines()
              if ln.strip().startswith("bash setup.sh && .venv/bin/python -m pytest")]
    assert len(ci) == 1 and readme == ci, (ci, readme)
