"""A rank the fork server (zygote) forks ends as `python SCRIPT` does: the fork server's
`leave` does the interpreter's shutdown in the interpreter's order (`simdist.forkserver`).
Every test that runs a script through `script_zygote` relies on it."""

from __future__ import annotations

import pytest

from tests.test_script_examples import _verdict, differences
from tests.test_script_modern_apis import _both


@pytest.mark.real
def test_an_idle_thread_pool_left_open_does_not_keep_a_forked_rank(script_zygote):
    """tests/scripts/thread_pool_left_open.py: each rank leaves an idle ThreadPoolExecutor
    open when it ends. Started as `python SCRIPT` (`simdist compare`) every rank ended; forked
    by the zygote each hung in its exit until the watchdog (300 s here): the fork server
    joined the pool's threads before `concurrent.futures`' exit hook woke them. torch.compile's
    inductor leaves such a pool (tests/test_script_compiled_gpus.py's inductor cases hung on
    a cold cache)."""
    sim, real = _both("thread_pool_left_open.py", 2, script_zygote)
    assert _verdict(sim) == _verdict(real) == ["completed"] * 2
    assert differences(sim, real) == []
    assert [r.output for r in sim.ranks] == [[f"[rank{r}] squares [0, 1, 4, 9] total 29.0"] for r in (0, 1)]
