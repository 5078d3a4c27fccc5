"""Scripts on the distributed APIs modern training code uses (DeviceMesh, DTensor, FSDP,
FSDP2, DDP communication hooks, distributed checkpoints, ...), run once simulated and once on
real Gloo: the two must agree rank by rank as `simdist compare` judges them (outcome, error
category, printed lines with their values, the line where each rank ended, the sequence of
operations), as in tests/test_script_examples.py."""

from __future__ import annotations

import pytest

from tests.test_script_examples import _run, _verdict, differences


def _both(script: str, nproc: int, zygote, *args: str):
    entry = {"script": f"../tests/scripts/{script}", "nproc": nproc, "args": list(args)}
    return _run(entry, "sim", zygote), _run(entry, "gloo", zygote)


@pytest.mark.real
def test_fsdp_and_dtensor_on_a_cpu_mesh_agree_with_real_gloo(script_zygote):
    """tests/scripts/fsdp_dtensor.py: a 1-D CPU DeviceMesh (on Gloo with CUDA visible, torch
    gives it a group of its own, as it decides by `get_backend`), DTensor Shard -> Replicate
    of uneven rows, a sharded matmul, FSDP and FSDP2 training steps: losses and parameters
    bit for bit."""
    sim, real = _both("fsdp_dtensor.py", 3, script_zygote)
    assert _verdict(sim) == ["completed"] * 3
    assert differences(sim, real) == []
    out = sim.ranks[2].output
    assert "[mesh rank2] DeviceMesh((3,), 'cpu', stride=(1,)) group mesh_default world False" in out, out
    assert "[dtensor rank2] local (2, 5) sum" in "".join(out)  # 10 rows over 3 ranks: 4, 4, 2
    assert any(line.startswith("[fsdp2 rank2] full {") for line in out)


@pytest.mark.real
def test_fsdp_with_a_rank_one_step_short_agrees_with_real_gloo(script_zygote):
    """The last rank runs one FSDP step fewer and leaves: on Gloo the others' next gradient
    reduce-scatter fails with the peer gone, on both sides."""
    sim, real = _both("fsdp_dtensor.py", 2, script_zygote, "--uneven")
    assert _verdict(sim) == ["error:peer_lost", "completed"]
    assert differences(sim, real) == []
