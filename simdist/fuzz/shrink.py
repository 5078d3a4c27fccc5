"""Greedy post-shrink: after hypothesis, drop ranks and lower input counts one at a time
while the same failure class still fails (hypothesis shrinks along the template's own
dimensions; this pass reaches the fewest ranks and inputs that still show the bug)."""

from __future__ import annotations

import copy
from collections.abc import Callable
from typing import Any

from simdist.fuzz.checker import Checker


def _drop_last_rank(d: dict[str, Any]) -> dict[str, Any] | None:
    w = d.get("world_size")
    if not isinstance(w, int) or w <= 1:
        return None
    gone = w - 1
    n = copy.deepcopy(d)
    n["world_size"] = gone
    inp = n.get("inputs", {})
    if isinstance(inp.get("counts"), list):
        inp["counts"] = inp["counts"][:gone]
    for g in n.get("groups", []):
        g["ranks"] = [r for r in g.get("ranks", []) if r != gone]
    n["groups"] = [g for g in n.get("groups", []) if g.get("ranks")]
    for section in ("loop", "after"):
        steps = []
        for st in n.get(section, []):
            if st.get("kind") == "p2p" and gone in (st.get("src"), st.get("dst")):
                continue
            if isinstance(st.get("ranks"), list):
                st["ranks"] = [r for r in st["ranks"] if r != gone]
                if not st["ranks"]:
                    continue
            steps.append(st)
        n[section] = steps
    return n


def _candidates(d: dict[str, Any]) -> list[dict[str, Any]]:
    out: list[dict[str, Any]] = []
    r = _drop_last_rank(d)
    if r is not None:
        out.append(r)
    counts = d.get("inputs", {}).get("counts")
    if isinstance(counts, list):
        for i, c in enumerate(counts):
            for smaller in sorted({0, c // 2, c - 1}):
                if 0 <= smaller < c:
                    n = copy.deepcopy(d)
                    n["inputs"]["counts"][i] = smaller
                    out.append(n)
    return out


def greedy_shrink(d: dict[str, Any], key: str, checker: Checker, limit: int = 400,
                  tick: Callable[[], None] | None = None) -> dict[str, Any]:
    """Drop ranks and inputs one at a time while the same failure class still fails.

    Steps are not dropped here: hypothesis already drops the template's optional steps, and
    a counterexample that stays an instance of its template still shows the family's bug."""
    tried = 0
    improved = True
    while improved and tried < limit:
        improved = False
        for cand in _candidates(d):
            tried += 1
            if tick:
                tick()
            o = checker.check(cand)
            if o is not None and o.key == key:
                d = cand
                improved = True
                break
            if tried >= limit:
                break
    return d
