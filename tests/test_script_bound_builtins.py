"""The rank layer's wrappers of builtins (`rank.writes`' `open` and `os.*`, `rank.boot`'s
`time.sleep`, `rank.simclock`'s clocks) bind no instance, as the builtins they replace:
`opener = open` in a class body, called as `self.opener(path, "w")`, got the instance as its
path (TypeError on every side simdist runs: the script ran fine without it); `clock =
time.monotonic` got it as an argument it does not take, on the simulated side (until the
ninth session)."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from tests.conftest import ROOT


@pytest.mark.real
def test_builtins_held_as_class_attributes_are_called_as_builtins(script_zygote, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    both = compare_script(ROOT / "tests" / "scripts" / "class_attr_builtins.py", ["."],
                          nproc_per_node=2, backend="gloo", measure_compute=False, zygotes=script_zygote,
                          timeout_s=120)
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    for rep in (both.sim.report, both.real.report):
        assert [(r.status, r.output) for r in rep.ranks] == [("completed", ["0 saved"]), ("completed", ["1 saved"])]
