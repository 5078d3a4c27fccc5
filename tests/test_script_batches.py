"""`--batches`: per-rank caps on DataLoader iterations, on simulated ranks and on real Gloo.

Each epoch of each loader is capped (`len()` agrees), with and without worker processes
(persistent or not); both sides honour the caps identically: the same printed lines, the
same batches per rank, the same collective sequence as real Gloo's Flight Recorder."""

from __future__ import annotations

import subprocess
import textwrap

import pytest

from simdist.errors import ScriptError
from simdist.script import run_script
from simdist.script.launch import new_run_id, tagged_processes
from simdist.vocab import P2P_OPS
from tests.conftest import EXAMPLES, descendants, run_cli

pytestmark = pytest.mark.real

LOADERS = textwrap.dedent("""
    import torch, torch.distributed as dist
    from torch.utils.data import DataLoader, TensorDataset

    dist.init_process_group("gloo")
    rank = dist.get_rank()
    ds = TensorDataset(torch.arange(40.0))
    train = DataLoader(ds, batch_size=2, num_workers=2, persistent_workers=True)  # 20 batches
    other = DataLoader(ds, batch_size=4, num_workers=1)  # 10 batches, workers made per epoch
    plain = DataLoader(ds, batch_size=5)  # 8 batches
    for epoch in range(2):
        n = sum(1 for _ in train)
        print(f"rank {rank} epoch {epoch}: train {n} of len {len(train)}, other {sum(1 for _ in other)}")
    it = iter(plain)
    print(f"rank {rank}: plain {len(it)} {sum(1 for _ in it)} {len(plain)}")
    t = torch.tensor([float(n)])
    dist.all_reduce(t)
    print(f"rank {rank}: total {int(t.item())}")
""")


def _keys(trace) -> list[tuple]:
    return [(e.seq, e.op, e.numel, e.group, e.origin) for e in trace if e.op not in P2P_OPS]


def _both(path, zygote, **kw):
    """One run per side, its ranks forked by the session's zygote for that mode (`script_zygote`);
    none of a run's processes outlives it."""
    out = []
    for mode in ("sim", "gloo"):
        run_id, z = new_run_id(), zygote(mode)
        out.append(run_script(path, timeout_s=300, run_id=run_id, mode=mode, zygote=z, **kw))
        assert tagged_processes(run_id) == [] and descendants(z.pid) == []
    return out


def test_every_epoch_of_every_loader_is_capped_with_workers_and_without(tmp_path, script_zygote):
    p = tmp_path / "loaders.py"
    p.write_text(LOADERS)
    for rep in _both(p, script_zygote, nproc_per_node=2, batches="3,12"):
        assert rep.outcome == "completed"
        r0, r1 = rep.ranks
        assert r0.output == ["rank 0 epoch 0: train 3 of len 3, other 3", "rank 0 epoch 1: train 3 of len 3, other 3",
                             "rank 0: plain 3 3 3", "rank 0: total 15"]
        assert r1.output == ["rank 1 epoch 0: train 12 of len 12, other 10",
                             "rank 1 epoch 1: train 12 of len 12, other 10", "rank 1: plain 8 8 8", "rank 1: total 15"]
        assert [r.inputs_processed for r in rep.ranks] == [3 * 2 + 3 * 2 + 3, 12 * 2 + 10 * 2 + 8]


def test_one_cap_for_every_rank_and_none_without_the_option(tmp_path, script_zygote):
    p = tmp_path / "loaders.py"
    p.write_text(LOADERS)
    rep = run_script(p, nproc_per_node=2, batches=1, zygote=script_zygote("sim"))
    assert [r.inputs_processed for r in rep.ranks] == [5, 5]
    rep = run_script(p, nproc_per_node=2, zygote=script_zygote("sim"))
    assert [r.inputs_processed for r in rep.ranks] == [20 * 2 + 10 * 2 + 8] * 2


def test_uneven_batches_without_join_fail_on_gloo_as_real_gloo_does(script_zygote):
    sim, real = _both(EXAMPLES / "fuzz_ddp_dataloader_no_join.py", script_zygote, nproc_per_node=2, batches="2,3", backend="gloo")
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["completed", "error"]
        assert rep.ranks[1].error.category == "peer_lost"
        assert rep.ranks[1].location.code == "loss.backward()"
        assert [r.inputs_processed for r in rep.ranks] == [2, 3]
    assert [r.output for r in sim.ranks] == [r.output for r in real.ranks] == [
        ["rank 0: epoch 0 done after 2 batches"], []]
    assert _keys(sim.ranks[0].trace) == _keys(real.ranks[0].trace)


def test_uneven_batches_under_join_complete_as_on_real_gloo(script_zygote):
    sim, real = _both(EXAMPLES / "fuzz_ddp_dataloader_join.py", script_zygote, nproc_per_node=3, batches="2,4,3", args=["--epochs", "2"])
    assert sim.outcome == real.outcome == "completed"
    assert [r.inputs_processed for r in sim.ranks] == [r.inputs_processed for r in real.ranks] == [4, 8, 6]
    for s, r in zip(sim.ranks, real.ranks, strict=True):
        assert s.output == r.output == [f"rank {s.rank}: epoch {e} done after {[2, 4, 3][s.rank]} batches"
                                        for e in range(2)]
        assert _keys(s.trace) == _keys(r.trace)


def test_a_cap_per_rank_must_match_the_world(tmp_path):
    p = tmp_path / "one.py"
    p.write_text("import torch.distributed as dist\n"  # env:// wants MASTER_ADDR/PORT, as in torch
                 "dist.init_process_group('gloo', init_method='tcp://127.0.0.1:29500', rank=0, world_size=1)\n")
    with pytest.raises(ScriptError, match="batches: 2 caps given .* world of 1 ranks"):
        run_script(p, batches="1,2", stdout=subprocess.DEVNULL)  # the world size is known only at init
    res = run_cli("run", "examples/fuzz_ddp_dataloader_join.py", "--nproc-per-node", "2", "--batches", "1,x")
    assert res.returncode == 2 and res.stderr.count("\n") == 1 and "batches" in res.stderr
    res = run_cli("run", "scenarios/ddp_join_uneven.toml", "--batches", "1")
    assert res.returncode == 2 and "--batches: only for a script" in res.stderr
