"""Scripts on the distributed APIs modern training code uses (DeviceMesh, DTensor, FSDP,
FSDP2, DDP communication hooks, distributed checkpoints, ...), run once simulated and once on
real Gloo: the two must agree rank by rank as `simdist compare` judges them (outcome, error
category, printed lines with their values, the line where each rank ended, the sequence of
operations), as in tests/test_script_examples.py."""

from __future__ import annotations

import threading

import pytest

from simdist.script.rank.callbacks import Runners
from tests.test_script_examples import _run, _verdict, differences


def _both(script: str, nproc: int, zygote, *args: str):
    entry = {"script": f"../tests/scripts/{script}", "nproc": nproc, "args": list(args)}
    return _run(entry, "sim", zygote), _run(entry, "gloo", zygote)


@pytest.mark.real
def test_fsdp_and_dtensor_on_a_cpu_mesh_agree_with_real_gloo(script_zygote):
    """tests/scripts/fsdp_dtensor.py: a 1-D CPU DeviceMesh (on Gloo with CUDA visible, torch
    gives it a group of its own, as it decides by `get_backend`), DTensor Shard -> Replicate
    of uneven rows, a sharded matmul, tensor parallelism (ColwiseParallel, RowwiseParallel),
    FSDP and FSDP2 training steps: losses and parameters bit for bit."""
    sim, real = _both("fsdp_dtensor.py", 3, script_zygote)
    assert _verdict(sim) == ["completed"] * 3
    assert differences(sim, real) == []
    out = sim.ranks[2].output
    assert "[mesh rank2] DeviceMesh((3,), 'cpu', stride=(1,)) group mesh_default world False" in out, out
    assert "[dtensor rank2] local (2, 5) sum" in "".join(out)  # 10 rows over 3 ranks: 4, 4, 2
    assert "[fsdp1 rank2] no device_id: accepted" in out  # as on a GPU machine (the simulated GPUs)
    assert any(line.startswith("[fsdp2 rank2] full {") for line in out)
    assert sum(line.startswith("[tp rank2] step") for line in out) == 2


@pytest.mark.real
def test_fsdp_with_a_rank_one_step_short_agrees_with_real_gloo(script_zygote):
    """The last rank runs one FSDP step fewer and leaves: on Gloo the others' next gradient
    reduce-scatter fails with the peer gone, on both sides."""
    sim, real = _both("fsdp_dtensor.py", 2, script_zygote, "--uneven")
    assert _verdict(sim) == ["error:peer_lost", "completed"]
    assert differences(sim, real) == []


@pytest.mark.real
def test_ddp_comm_hooks_agree_with_real_gloo(script_zygote):
    """tests/scripts/ddp_comm_hooks.py: allreduce, fp16 and the fp16 wrapper, bf16 (accepted
    on simulated GPUs, as a CUDA build with NCCL accepts it whatever the model's device:
    `rank.cuda_build`; before, refused on both sides; its all-reduces are bf16), and two hooks
    of the user's own returning futures (a `then` on an async all_reduce's future, a Future
    completed by hand): losses and parameters bit for bit, several buckets per step."""
    sim, real = _both("ddp_comm_hooks.py", 3, script_zygote)
    assert _verdict(sim) == ["completed"] * 3
    assert differences(sim, real) == []
    out = sim.ranks[0].output
    assert sum(line.startswith("[bf16 rank0] losses") for line in out) == 1
    assert "bfloat16" in {e.dtype for e in sim.ranks[0].trace}
    assert sum(line.startswith("[user_then rank0] losses") for line in out) == 1
    assert sum(line.startswith("[user_waits rank0] losses") for line in out) == 1  # its callback waited
    per_step = [line for line in out if "buckets per step" in line]
    assert len(per_step) == 7 and all(int(line.split()[5]) >= 2 for line in per_step), per_step


def _racy_origins_as_unknown(sim, real) -> None:
    """An op issued inside a future's `then` callback is issued on whichever thread completed
    that future: the caller's, inside autograd (`ddp.backward...`), when the future was done
    before `then` was called, else Gloo's worker thread, with no Python frames ("unknown").
    Which one is a race on real Gloo (seen both ways for one rank and op in two runs): where
    one side says "unknown" and the other DDP's bucket all-reduce (PowerSGD's all-reduces of
P and Q), that op's origin is not compared. Everything else is."""
    racy = {"unknown", "ddp.backward.bucket_allreduce"}
    for rs, rr in zip(sim.ranks, real.ranks, strict=True):
        for es, er in zip(rs.trace, rr.trace, strict=False):
            if es.op == er.op == "all_reduce" and {es.origin, er.origin} == racy:
                es.origin = er.origin = "unknown"


@pytest.mark.real
def test_powersgd_agrees_with_real_gloo(script_zygote):
    """PowerSGD (warm-up steps, then rank-1 compression with error feedback): its all-reduces
    of P and Q are issued from `then` callbacks and waited on there (the simulated future's
    callbacks run on a thread of their own, as Gloo's worker threads, not on the thread that
    reads the coordinator's answers); a bucket of matrices only makes its first all-reduce
    empty, which Gloo completes at once without the wire. Values, ops and sizes agree; of the
    ops issued in callbacks, the origin is a race (`_racy_origins_as_unknown`)."""
    sim, real = _both("ddp_comm_hooks.py", 3, script_zygote, "--powersgd")
    assert _verdict(sim) == ["completed"] * 3
    _racy_origins_as_unknown(sim, real)
    assert differences(sim, real) == []
    assert any(e.numel == 0 for e in sim.ranks[0].trace)  # the empty all-reduce of a bucket of matrices
    assert sum(line.startswith("[powersgd rank0] losses") for line in sim.ranks[0].output) == 1


@pytest.mark.real
def test_ddp_unused_parameter_error_syncbn_and_static_graph_agree_with_real_gloo(script_zygote):
    """tests/scripts/ddp_unused_error.py: find_unused_parameters=False with a branch skipped on
    one step raises DDP's "Expected to have finished reduction" on the next step on every rank;
    SyncBatchNorm is refused on the CPU; find_unused_parameters=True and static_graph=True
    train, losses bit for bit."""
    sim, real = _both("ddp_unused_error.py", 2, script_zygote)
    assert _verdict(sim) == ["completed"] * 2
    assert differences(sim, real) == []
    out = sim.ranks[1].output
    assert any(line.startswith("[strict rank1] step 2: RuntimeError: Expected to have finished reduction")
               for line in out)
    assert "[syncbn rank1] ValueError: SyncBatchNorm layers only work with GPU modules" in out


@pytest.mark.real
def test_rooted_objects_p2p_ring_and_dcp_agree_with_real_gloo(script_zygote):
    """tests/scripts/objects_p2p_dcp.py: a batch_isend_irecv ring both ways, then collectives
    rooted at the last rank (the real side's reduce ops and roots are keyed by collective
    number, which the group's sequence number exceeds by its p2p operations), object
    collectives of uneven sizes, barrier(device_ids=...), empty all_reduces (done at once,
    peers or not), and a torch.distributed.checkpoint save, async_save (it wants the group to
    list a CPU device, as Gloo's lists cuda and cpu) and load (its writer uses CUDA streams
    once CUDA is visible: on the CPU they have nothing to wait for)."""
    sim, real = _both("objects_p2p_dcp.py", 3, script_zygote)
    assert _verdict(sim) == ["completed"] * 3
    assert differences(sim, real) == []
    out = sim.ranks[0].output
    assert "[ring rank0] from left [2.0, 2.0, 2.0] from right [11.0, 11.0]" in out
    assert "[scatter_object_list rank0] ['shard-0']" in out
    assert "[empty rank0] done before the peers: True" in out
    assert "[empty rank0] reduce, all_gather done before the peers: [True, True]" in out
    assert "[ring rank0] completed before wait [False, False, False, False] after [True, True, True, True]" in out
    assert any(line.startswith("[reduce_scatter_tensor rank0]") and line.endswith("completed False success True")
               for line in out), out
    assert any(line.startswith("[dcp rank0] restored") and "__2_0.distcp" in line for line in out)
    assert "[dcp rank0] group devices ['cuda', 'cpu']" in out


def _recording_runners():
    """A fresh `Runners`, the order jobs ran in, their threads, and a job maker that records both."""
    order: list[str] = []
    threads: list[threading.Thread] = []

    def plain(name):
        order.append(name)
        threads.append(threading.current_thread())

    return Runners(), order, threads, plain


def test_callbacks_run_in_order_and_one_that_waits_hands_the_queue_on():
    """`rank.callbacks.Runners`: completions run one at a time in the order they came; a
    callback that parks (it issued or waits on an operation) lets the next run on a fresh
    thread, which is what completes the operation it waits for."""
    runners, order, threads, plain = _recording_runners()
    released, finished = threading.Event(), threading.Event()

    def waits():
        order.append("waits: start")
        runners.park()
        assert released.wait(10)
        order.append("waits: end")
        finished.set()

    for job in (lambda: plain("a"), lambda: plain("b"), waits, lambda: plain("c"), released.set):
        runners.submit(job)
    assert finished.wait(10)
    assert order[:4] == ["a", "b", "waits: start", "c"] and order[-1] == "waits: end"
    assert threads[0] is threads[1] is not threads[2]  # the same runner until one parked
    assert threading.current_thread() not in threads


def test_a_callback_that_blocks_without_parking_still_hands_the_queue_on():
    """A callback may block on a future it got before it started (`fa.then(lambda f:
    fb.wait())`): it never calls `park()`, and the completion it waits for is queued behind it.
    Once it has run `HANDOFF_S` with work queued, a fresh runner takes the queue (Gloo's other
    worker thread would); jobs that do not block keep their order on one thread."""
    runners, order, threads, plain = _recording_runners()
    released, finished = threading.Event(), threading.Event()

    def blocks():
        order.append("blocks: start")
        assert released.wait(10)
        order.append("blocks: end")
        finished.set()

    for job in (lambda: plain("a"), lambda: plain("b"), blocks, lambda: plain("c"), released.set):
        runners.submit(job)
    assert finished.wait(10)
    assert order == ["a", "b", "blocks: start", "c", "blocks: end"]
    assert threads[0] is threads[1] is not threads[2]


def test_a_job_that_raises_does_not_stop_the_runner(capsys):
    """An error escaping a job is printed and the queue goes on (the thread must not die with
    completions still queued: their waiters would hang)."""
    runners, done = Runners(), threading.Event()

    def fails():
        raise ValueError("boom in a callback")

    runners.submit(fails)
    runners.submit(done.set)
    assert done.wait(10)
    assert "ValueError: boom in a callback" in capsys.readouterr().err
