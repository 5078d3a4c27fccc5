"""The example scripts on simulated ranks and, through the same launcher, on real Gloo:
the same printed lines per rank, the same outcome, and the same collective sequence as
real Gloo's Flight Recorder shows (op, size, dtype, group, sequence number, origin).

The Join tutorial's programs ask for nccl and cuda:{rank}; on real Gloo they run with the
layer's CPU remapping too ("gloo" mode), so both sides run the published files unmodified."""

from __future__ import annotations

import pytest

from simdist.script import run_script
from simdist.script.launch import new_run_id, tagged_processes
from simdist.vocab import P2P_OPS
from tests.conftest import EXAMPLES, line_of

pytestmark = pytest.mark.real


def _keys(trace) -> list[tuple]:
    # FR records no p2p on Gloo, nor a barrier's dtype (it has no tensor)
    return [(e.seq, e.op, e.numel, e.dtype if e.numel else "-", e.group, e.origin) for e in trace
            if e.op not in P2P_OPS]


@pytest.fixture
def both(example_run):
    """`both(name, **kw)`: the program's simulated run and its real Gloo run, each made once
    in the session (`example_run`): the tests that read a program's simulated run (what it
    prints, its trace; here and in test_script_join_tutorial/test_script_hang) share them."""
    def get(name: str, **kw) -> list:
        return [example_run(name, mode, **kw) for mode in ("sim", "gloo")]

    return get


@pytest.mark.parametrize("name", [
    "join_tutorial_ddp.py", "join_tutorial_ddp_zero.py", "join_tutorial_counter.py",
    "dist_tutorial_p2p_blocking.py", "dist_tutorial_p2p_nonblocking.py", "dist_tutorial_allreduce.py",
    "dist_tutorial_ring_allreduce.py", "dist_tutorial_sync_sgd.py",
])
def test_example_agrees_with_real_gloo(name, both):
    sim, real = both(name)
    assert (sim.source, real.source) == ("sim", "real")
    assert sim.outcome == real.outcome == "completed"
    for s, r in zip(sim.ranks, real.ranks, strict=True):
        assert s.output == r.output and s.output  # exact values: the printed floats agree digit for digit
        assert _keys(s.trace) == _keys(r.trace)
        assert all(e.completed for e in s.trace)  # (FR's `retired` flag may lag a sync op's return)


def test_no_join_on_gloo_fails_as_real_gloo_does(both):
    sim, real = both("join_tutorial_no_join.py", backend="gloo")
    assert [r.status for r in sim.ranks] == [r.status for r in real.ranks] == ["completed", "error"]
    assert sim.ranks[1].error.category == real.ranks[1].error.category == "peer_lost"
    assert _keys(sim.ranks[1].trace) == _keys(real.ranks[1].trace)
    assert sim.ranks[1].location.code == real.ranks[1].location.code == "loss.backward()"


# What each tutorial program prints (section 2.1, 2.2, 3.1; the ring all-reduce sums 1 and 2).
_PRINTS = {
    "dist_tutorial_p2p_blocking.py": [["Rank  0  has data  tensor(1.)"], ["Rank  1  has data  tensor(1.)"]],
    "dist_tutorial_p2p_nonblocking.py": [["Rank 0 started sending", "Rank  0  has data  tensor(1.)"],
                                         ["Rank 1 started receiving", "Rank  1  has data  tensor(1.)"]],
    "dist_tutorial_allreduce.py": [["Rank  0  has data  tensor(2.)"], ["Rank  1  has data  tensor(2.)"]],
    "dist_tutorial_ring_allreduce.py": [["Rank  0  has data  tensor([3., 3., 3., 3.])"],
                                        ["Rank  1  has data  tensor([3., 3., 3., 3.])"]],
}


@pytest.mark.parametrize("name", sorted(_PRINTS))
def test_dist_tutorial_prints_what_the_tutorial_prints(name, both):
    rep = both(name)[0]
    assert rep.outcome == "completed"
    assert [r.output for r in rep.ranks] == _PRINTS[name]


def test_sync_sgd_prints_one_loss_per_epoch_and_averages_every_gradient(both):
    rep = both("dist_tutorial_sync_sgd.py")[0]
    assert rep.outcome == "completed"
    for r in rep.ranks:
        assert [line.split(":")[0] for line in r.output] == [f"Rank  {r.rank} , epoch  {k} " for k in range(10)]
        # 8 parameters (conv1, conv2, fc1, fc2: weight and bias) per batch, 2 batches per epoch
        assert [e.op for e in r.trace] == ["all_reduce"] * 8 * 2 * 10
        line = line_of(EXAMPLES / "dist_tutorial_sync_sgd.py", "dist.all_reduce(param.grad.data")
        assert {e.origin for e in r.trace} == {f"user.dist_tutorial_sync_sgd.py:{line}"}


_ABORT_AT_TEARDOWN = '''
import ctypes, os, sys
import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def worker(rank, out):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "localhost", "29500"
    dist.init_process_group("gloo", rank=rank, world_size=2)
    t = torch.ones(1)
    dist.all_reduce(t)
    if rank == 0:
        log = open(os.path.join(out, "rank0.log"), "w")
        log.write("finished\\n")  # left open: the interpreter's teardown would flush it
        libc = ctypes.CDLL(None)
        libc.__cxa_atexit(libc.abort, None, None)  # C++ teardown aborts, as Gloo's threads may
    else:
        dist.all_reduce(t)  # no partner: rank 0 has left


if __name__ == "__main__":
    mp.spawn(worker, args=(sys.argv[1],), nprocs=2)
'''


@pytest.mark.parametrize("mode", ["sim", "gloo"])
def test_a_finished_rank_is_not_aborted_by_teardown(tmp_path, mode):
    """Gloo at interpreter exit can std::terminate a rank that had finished (SIGABRT); mp.spawn
    then kills the other ranks, and what they report changes at random. A finished rank leaves
    as a forked multiprocessing child does: its exit handlers run and its open files are
    flushed, but not C++ teardown (where the abort is injected here), so its peers fail as
    they would on their own."""
    p = tmp_path / "abort_at_teardown.py"
    p.write_text(_ABORT_AT_TEARDOWN)
    run_id = new_run_id()
    rep = run_script(p, [str(tmp_path)], timeout_s=300, run_id=run_id, mode=mode, stdout=-3)
    assert tagged_processes(run_id) == []
    r0, r1 = rep.ranks
    assert (r0.status, r0.exit) == ("completed", "returned normally")
    assert r1.status == "error" and r1.error.category == "peer_lost"  # not killed by mp.spawn
    assert (tmp_path / "rank0.log").read_text() == "finished\n"
