"""The public Python API (`simdist/__init__`): every name resolves to its one definition, the
documented import works, and importing simdist stays light (no torch, no real_backend)."""

from __future__ import annotations

import ast
import importlib
import subprocess
import sys

import pytest
import tomllib

import simdist

from .conftest import ROOT, SCENARIOS


def test_documented_import_works_without_torch_or_real_backend():
    code = (
        "import sys\n"
        "from simdist import load_scenario, simulate, check_run, compare_reports, fuzz_template, Report\n"
        "assert 'torch' not in sys.modules and 'real_backend' not in sys.modules, 'import simdist got heavy'\n"
        f"s = load_scenario({str(SCENARIOS / 'no_join_hang.toml')!r})\n"
        "r = simulate(s)\n"
        "assert isinstance(r, Report) and r.outcome == 'hang'\n"
        "v = check_run(r, s)\n"
        "assert v.failed and v.kind == 'hang', v.kind\n"
        "assert compare_reports(r, r).agree\n"
        "assert 'torch' not in sys.modules and 'real_backend' not in sys.modules, 'the simulator pulled in torch'\n"
    )
    res = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, cwd=ROOT, timeout=120)
    assert res.returncode == 0, res.stderr


def test_every_public_name_is_its_defining_modules_object():
    assert set(simdist.__all__) == {"__version__", *simdist._EXPORTS}
    for name, module in simdist._EXPORTS.items():
        assert getattr(simdist, name) is getattr(importlib.import_module(module), name), name
    assert set(simdist._EXPORTS) <= set(dir(simdist))


@pytest.mark.parametrize("name", sorted(simdist._EXPORTS))
def test_every_public_name_says_what_it_is_for(name):
    doc = (getattr(simdist, name).__doc__ or "").strip()
    assert doc and not doc.startswith(f"{name}("), f"simdist.{name} has no docstring (a dataclass's is its signature)"


def test_type_checking_imports_match_the_lazy_table():
    """Type checkers read the TYPE_CHECKING block, the runtime reads `_EXPORTS`: the same names
    from the same modules (and the import-cycle test sees every edge through that block)."""
    tree = ast.parse((ROOT / "simdist" / "__init__.py").read_text())
    block = next(n for n in tree.body if isinstance(n, ast.If) and getattr(n.test, "id", "") == "TYPE_CHECKING")
    seen = {a.name: imp.module for imp in block.body if isinstance(imp, ast.ImportFrom) for a in imp.names}
    assert seen == simdist._EXPORTS


def test_unknown_name_is_an_attribute_error():
    try:
        simdist.no_such_thing  # noqa: B018
    except AttributeError as e:
        assert "no_such_thing" in str(e)
    else:
        raise AssertionError("simdist.no_such_thing resolved")


def test_package_is_typed():
    assert (ROOT / "simdist" / "py.typed").is_file()
    cfg = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert "py.typed" in cfg["tool"]["setuptools"]["package-data"]["simdist"]
