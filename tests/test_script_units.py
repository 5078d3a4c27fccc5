"""Script backend pieces that need no process: wire format, exact payloads, origins, report JSON."""

from __future__ import annotations

import json
import os
import socket
import threading

import numpy as np
import pytest

from simdist.engine.values import Payload, chunk_payload, concat_payloads, reduce_payloads
from simdist.frames import Frame, script_origin, user_label
from simdist.report import CodeLocation, RankResult, Report
from simdist.script import payloads, wire


def test_wire_roundtrip_blocking_and_incremental():
    a, b = socket.socketpair()
    big = np.arange(300_000, dtype=np.float32)

    def sender() -> None:  # more than a socket buffer: the other end must read meanwhile
        wire.send(a, {"t": "op", "id": 1}, [big.tobytes(), b"xy"])
        wire.send(a, {"t": "out", "x": "line"})

    th = threading.Thread(target=sender)
    th.start()
    header, bufs = wire.recv(b)
    assert header == {"t": "op", "id": 1}
    assert np.array_equal(np.frombuffer(bufs[0], dtype=np.float32), big) and bytes(bufs[1]) == b"xy"
    assert wire.recv(b) == ({"t": "out", "x": "line"}, [])
    th.join()
    # the coordinator's decoder takes the same bytes in arbitrary pieces
    wire.send(a, {"t": "done", "id": 7}, [b"abc"])
    wire.send(a, {"t": "done", "id": 8})
    a.close()
    raw = b""
    while chunk := b.recv(5):
        raw += chunk
    dec = wire.Decoder()
    got = []
    for i in range(0, len(raw), 3):
        got += dec.feed(raw[i : i + 3])
    assert [(h["id"], [bytes(x) for x in bs]) for h, bs in got] == [(7, [b"abc"]), (8, [])]
    assert wire.recv(b) is None  # closed


def test_exact_payloads_keep_values_at_any_size():
    n = 1000
    x = np.random.default_rng(0).standard_normal(n).astype(np.float32)
    y = np.random.default_rng(1).standard_normal(n).astype(np.float32)
    px, py = Payload.from_array(x, "float32", exact=True), Payload.from_array(y, "float32", exact=True)
    s = reduce_payloads([px, py], "sum", "float32", n)
    assert s.exact and np.array_equal(s.values, x + y)  # float32 adds, as Gloo does for two ranks
    g = concat_payloads([px, py], "float32")
    assert g.exact and np.array_equal(g.values, np.concatenate([x, y]))
    c = chunk_payload(g, 1, 2)
    assert np.array_equal(c.values, y)
    # scenario payloads are unchanged: no values kept above the explicit limit
    assert Payload.from_array(x, "float32").values is None


@pytest.mark.parametrize("dtype", ["float32", "float64", "float16", "int64", "int32", "uint8", "bool", "bfloat16"])
def test_payload_bytes_roundtrip(dtype):
    import torch

    t = (torch.arange(10) * 3 - 7).to(getattr(torch, dtype))
    raw = t.contiguous().view(torch.uint8).numpy().tobytes()
    p = payloads.to_payload(raw, dtype, t.numel())
    back = torch.frombuffer(bytearray(payloads.to_bytes(p)), dtype=t.dtype)
    assert torch.equal(back, t)


def test_bfloat16_sum_rounds_like_torch():
    import torch

    a = torch.tensor([1.0, 3.14159, -2.5e3, 1e-3], dtype=torch.bfloat16)
    b = torch.tensor([0.00390625, 2.71828, 7.0, 1e-3], dtype=torch.bfloat16)
    pa = payloads.to_payload(a.view(torch.uint8).numpy().tobytes(), "bfloat16", 4)
    pb = payloads.to_payload(b.view(torch.uint8).numpy().tobytes(), "bfloat16", 4)
    s = reduce_payloads([pa, pb], "sum", "bfloat16", 4)
    got = torch.frombuffer(bytearray(payloads.to_bytes(s)), dtype=torch.bfloat16)
    assert torch.equal(got, a + b)


def _frame(filename: str, line: int, name: str, tag: str | None = None, qual: str | None = None) -> Frame:
    return Frame(tag, qual, name, filename, line)


def test_script_origin_user_call_inside_torch_context_is_the_users():
    torch_c10d = _frame("/site-packages/torch/distributed/distributed_c10d.py", 10, "all_reduce")
    hook = _frame("/home/u/train.py", 42, "hook")
    autograd = _frame("/site-packages/torch/autograd/graph.py", 5, "_engine_run_backward", "autograd",
                      "_engine_run_backward")
    backward = _frame("/home/u/train.py", 60, "main")
    # a user's gradient hook under loss.backward(): the user's call, not DDP's bucket
    assert script_origin([torch_c10d, hook, autograd, backward], [False, True, False, True], "float32") == \
        user_label("/home/u/train.py", 42) == "user.train.py:42"
    # DDP's reducer under the same backward: torch's component label
    assert script_origin([autograd, backward], [False, True], "float32") == "ddp.backward.bucket_allreduce"
    assert script_origin([torch_c10d], [False], "float32") == "unknown"
    # DDP's comm hook under the reducer is still DDP's bucket; FSDP2's post-backward (Python
    # under autograd, no DDP) is not: the collective is the user's backward()
    comm_hook = _frame("/site-packages/torch/distributed/algorithms/ddp_comm_hooks/default_hooks.py", 3, "allreduce_hook")
    assert script_origin([torch_c10d, comm_hook, autograd, backward], [False] * 3 + [True], "float32") == \
        "ddp.backward.bucket_allreduce"
    fsdp2 = _frame("/site-packages/torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py", 9, "foreach_reduce")
    assert script_origin([torch_c10d, fsdp2, autograd, backward], [False] * 3 + [True], "float32") == "user.train.py:60"
    # DDP's own Python under the reducer's backward (`delay_all_reduce_named_params`: its
    # `_delayed_all_reduce_hook` all-reduces the delayed parameters' gradients) is DDP's too
    delayed = _frame("/site-packages/torch/nn/parallel/distributed.py", 1203, "_delayed_all_reduce_hook", "ddp",
                     "DistributedDataParallel._delayed_all_reduce_hook")
    assert script_origin([torch_c10d, delayed, autograd, backward], [False] * 3 + [True], "float32") == \
        "ddp.backward.bucket_allreduce"


def test_report_json_leaves_script_fields_out_unless_set():
    plain = Report("s", "sim", "completed", [RankResult(0, "completed")])
    d = plain.to_dict()
    assert "timings" not in d and not {"output", "stderr", "location", "exit"} & set(d["ranks"][0])
    r = RankResult(0, "hang", output=["hi"], location=CodeLocation("/x/t.py", 3, "main", "f()"), exit="blocked")
    rep = Report("t.py", "sim", "hang", [r], timings={"wall_s": 1.0})
    back = Report.from_dict(json.loads(rep.to_json()))
    assert back.ranks[0].location == r.location and back.ranks[0].output == ["hi"] and back.timings == {"wall_s": 1.0}
    assert back.ranks[0].location.short() == "t.py:3 in main: f()"


def test_a_sigabrt_after_a_reported_end_is_shutdown_not_failure():
    import signal

    from simdist.report import shutdown_abort

    assert shutdown_abort(-signal.SIGABRT, finished=True)
    assert not shutdown_abort(-signal.SIGABRT, finished=False)  # died before saying how it ends
    assert not shutdown_abort(-signal.SIGABRT, finished=True, thrown=True)  # a Gloo abort mid-run
    assert not shutdown_abort(-signal.SIGKILL, finished=True)
    assert not shutdown_abort(None, finished=True)  # a rank the script started itself: no status known


def test_the_cannot_model_error_is_found_wherever_torch_wrapped_it():
    from simdist.script.env import UNSUPPORTED, unsupported_in

    msg = UNSUPPORTED.format("recv from any source (dist.recv without src)")
    assert unsupported_in(msg) == "recv from any source (dist.recv without src)"
    assert unsupported_in(f"RuntimeError: in a DDP hook:\n{msg}\nmore") == "recv from any source (dist.recv without src)"
    assert unsupported_in("Connection closed by peer") is None


def test_gloo_reads_a_non_contiguous_tensor_as_the_memory_it_starts():
    """`gloo_args.gloo_memory`: the flat run ProcessGroupGloo reads and writes (measured on
    real Gloo by tests/scripts/tensor_kinds.py); a run past the storage is not the tensor's."""
    import torch

    from simdist.script.rank import gloo_args

    m = torch.arange(12.0).view(3, 4)
    assert gloo_args.gloo_memory(m[:, 1]).tolist() == [1.0, 2.0, 3.0]
    gloo_args.gloo_memory(m[:, 1]).add_(100)  # written through: the matrix's memory changes
    assert m[0].tolist() == [0.0, 101.0, 102.0, 103.0]
    assert gloo_args.gloo_memory(m[1]) is not None and gloo_args.gloo_memory(m[1]).data_ptr() == m[1].data_ptr()
    assert gloo_args.gloo_memory(torch.zeros(1).expand(5)) is None
    with pytest.raises(RuntimeError, match=r"allgather: invalid tensor size at index 0 \(expected \(3\), got \(1, 3\)\)"):
        gloo_args.allgather_check(torch.zeros(2, 3).chunk(2), torch.zeros(3), 2)
    with pytest.raises(RuntimeError, match=r"outputShape\[0\] \* worldSize == inputShape\[0\] \(4 vs\. 8\)"):
        gloo_args.reduce_scatter_check(torch.zeros(2, 2), torch.zeros(8), 2)


def test_an_op_issued_from_a_callback_is_sent_before_its_runner_hands_the_queue_on(monkeypatch):
    """A callback issuing an op parks its runner (it may wait on the op next), but only after
    the op message is sent: a fresh runner taking the queue earlier could send a later
    callback's op first, reordering the rank's operations."""
    import torch

    from simdist.script.rank import callbacks, client
    from simdist.script.rank.pg import SimProcessGroup

    runners, sent, done = callbacks.Runners(), [], threading.Event()

    class Client:
        semantics = "gloo"

        def new_op(self, work, track=True):
            return len(sent) + 1

        def send(self, header, bufs=(), claim=False, register=None):
            sent.append((header["op"], runners._active is threading.current_thread()))

    monkeypatch.setattr(client, "CLIENT", Client())
    monkeypatch.setattr(callbacks, "RUNNERS", runners)
    pg, t = SimProcessGroup(0, 2, "0", [0, 1]), torch.ones(3)

    def callback():
        pg._issue("all_reduce", [t], [t], [t], numel=3, dtype="float32")
        done.set()

    runners.submit(callback)
    assert done.wait(10)
    assert sent == [("all_reduce", True)]  # sent while its runner still held the queue


def test_a_forked_rank_gets_runners_of_its_own(monkeypatch):
    """After a fork the parent's runner threads do not exist in the child: the child must not
    queue completions behind a runner that never runs (the zygote forks ranks)."""
    import os

    from simdist.script.rank import boot, callbacks

    held, release = callbacks.Runners(), threading.Event()
    monkeypatch.setattr(callbacks, "RUNNERS", held)
    held.submit(release.wait)  # the parent's runner is busy in a job
    held.submit(lambda: None)
    pid = os.fork()
    if pid == 0:  # the child: what `boot` registers at fork, minus the launcher's bookkeeping
        ok = threading.Event()
        try:
            callbacks.forget_after_fork()
            callbacks.RUNNERS.submit(ok.set)
            os._exit(0 if callbacks.RUNNERS is not held and ok.wait(5) else 1)
        finally:
            os._exit(2)
    release.set()
    assert os.waitpid(pid, 0)[1] == 0
    # and the hook boot registers at fork does it (its other steps are the launcher's)
    from simdist import procs
    from simdist.script.rank import client, output

    for mod, name in ((client, "forget_after_fork"), (output, "forget_after_fork"), (procs, "die_with_parent")):
        monkeypatch.setattr(mod, name, lambda: None)
    monkeypatch.setenv(procs.LAUNCHER_PID_ENV, "0")
    boot._after_fork_child()
    assert callbacks.RUNNERS is not held


def test_the_empty_op_rule_is_gloos():
    """One rule (`vocab.gloo_empty_is_local`) for the engine and the script backend: Gloo's
    empty all_reduce, reduce and all_gather are local; its empty broadcast is not."""
    from simdist.vocab import gloo_empty_is_local

    assert [gloo_empty_is_local(op, 0) for op in ("all_reduce", "reduce", "all_gather", "broadcast")] == \
        [True, True, True, False]
    assert not gloo_empty_is_local("all_reduce", 1)


def test_the_stall_rule_waits_for_every_live_rank_and_the_settle_period():
    """`StallRule.hung_since`: hung only when every live rank has been stalled for the settle
    period since the last stall began and the last process ended; a rank not stalled, one
    leaving, or a Gloo timeout shorter than the watchdog leaves the run to go on."""
    from simdist.errors import InputError
    from simdist.script.ranks import RankConn
    from simdist.script.stalls import StallRule, check_hang_after

    def conn(since, limit=1800.0, **kw):
        c = RankConn(socket.socket())
        c.sock.close()
        c.stall_since, c.stall_limit = since, limit
        for k, v in kw.items():
            setattr(c, k, v)
        return c

    rule = StallRule(hang_after_s=3.0, watchdog_s=300.0)
    assert rule.hung_since([conn(100.0), conn(101.0)], now=104.0) == 101.0
    assert rule.hung_since([conn(100.0), conn(101.0)], now=103.9) is None  # the last began 2.9 s ago
    assert rule.hung_since([conn(100.0), conn(None)], now=200.0) is None  # rank 1 computes or sleeps
    assert rule.hung_since([conn(100.0), conn(100.0, exit={"how": "returned"})], now=200.0) is None  # leaving
    assert rule.hung_since([conn(100.0), conn(100.0, limit=60.0)], now=200.0) is None  # Gloo's timeout first
    assert rule.hung_since([conn(100.0), conn(100.0, limit=None)], now=200.0) == 100.0
    # a rank whose process ended: its peers' waits may still fail, so the period starts there
    gone = conn(None, connected=False, ended_at=102.5)
    assert rule.hung_since([conn(100.0), gone], now=105.0) is None
    assert rule.hung_since([conn(100.0), gone], now=105.5) == 102.5
    assert rule.hung_since([gone], now=500.0) is None
    # the note says what was seen, no more: Gloo's idle threads do wake (so "next to no CPU", not none)
    note = rule.note(100.0, 104.0, [conn(100.0, rank=0, connected=True), conn(101.0, rank=1, connected=True)])
    assert note.startswith("hang found early (--hang-after 3 s, not the 300 s watchdog): for 4.0 s every live "
                           "rank (0, 1) had its main thread (and any other thread of the script) asleep"), note
    assert "next to no CPU" in note and "their Gloo timeouts (1800 s and up)" in note, note
    # ranks waiting at the c10d store (`rank.stall.store_wait`): each named, by its call and line
    note = rule.note(100.0, 104.0, [conn(100.0, rank=1, connected=True, stall_in="new_group at x.py:7"),
                                    conn(101.0, rank=0, connected=True, stall_in="init_process_group at x.py:3"),
                                    conn(101.0, rank=2, connected=True)])
    assert ("no operation completed on any rank; at the c10d store, waiting for peers that never come: rank 0 in "
            "init_process_group at x.py:3; rank 1 in new_group at x.py:7; their Gloo and store timeouts (1800 s and "
            "up) would not end these waits before the watchdog") in note, note
    assert check_hang_after(None) is None and check_hang_after(0) is None and check_hang_after(2) == 2.0
    for bad in (-1, float("nan"), float("inf"), True, "3"):
        with pytest.raises(InputError, match="--hang-after: must be a number of seconds"):
            check_hang_after(bad)  # type: ignore[arg-type]


def test_a_forked_rank_forgets_its_parents_thread_waits():
    """`rank.stall` keeps each thread's `Work.wait(timeout=)` in progress: those bound a stall.
    A forked child has only the forking thread, so what the parent's other threads waited on
    is not the child's (it kept the child's stalls bounded, with no early verdict)."""
    import threading

    from simdist.script.rank import stall

    stall._wait_limits[threading.get_ident() + 1] = [5.0]  # another thread of this process, in a timed wait
    try:
        pid = os.fork()
        if pid == 0:  # what the at-fork hook `stall.install` registers runs in the child
            stall._note_main_tid()
            os._exit(0 if set(stall._wait_limits) <= {threading.get_ident()} else 1)
        assert os.waitpid(pid, 0)[1] == 0
    finally:
        stall._wait_limits.pop(threading.get_ident() + 1, None)


def test_a_thread_in_torchs_store_based_barrier_waits_at_the_store():
    """`rank.stall.store_wait` reads where a thread stands: in torch's `_store_based_barrier`
    (a store wait for its peers, here on a HashStore that no peer joins), called from this
    file's line, with the barrier's timeout as its deadline, named as the simulator names a
    wait there (`stores.BARRIER_CALL`; no group: no world here to count); elsewhere, no store wait."""
    import datetime
    import sys
    import time

    import torch.distributed as dist
    from torch.distributed import distributed_c10d as c10d

    from simdist.script.rank import stall
    from simdist.script.stores import BARRIER_CALL

    store, began = dist.HashStore(), threading.Event()

    def barrier() -> None:
        began.set()
        c10d._store_based_barrier(0, store, "g", 2, datetime.timedelta(seconds=60))  # line `at`

    at = barrier.__code__.co_firstlineno + 2
    t = threading.Thread(target=barrier, daemon=True)
    t.start()
    try:
        began.wait()
        for _ in range(200):  # until it stands in the store's wait
            seen = stall.store_wait(sys._current_frames().get(t.ident or 0))
            if seen is not None:
                break
            time.sleep(0.01)
        assert seen == stall.StoreWait(BARRIER_CALL, (__file__, at), 60.0)
        assert stall.store_wait(sys._getframe()) is None and stall.store_wait(None) is None
    finally:
        store.set(f"{c10d.STORE_BASED_BARRIER_PREFIX}:g:last_worker", "1")  # the barrier returns
        t.join(30)
    assert not t.is_alive()


def test_a_store_wait_names_the_group_only_from_both_of_the_helpers_parameters():
    """`rank.stall._group_of` reads the group a store wait in `_new_process_group_helper`
    creates from its parameters `group_name` and `global_ranks_in_group` (frames of functions
    of that name here, standing in for torch's); the default group (no members), a frame of
    another function, or a helper that lacks `group_name` (another torch) names none: one
    name for every such group would merge their status lines."""
    import sys

    from simdist.script.rank import stall

    def _new_process_group_helper(group_size, group_rank, global_ranks_in_group, backend, store, group_name):
        return sys._getframe()

    def other(global_ranks_in_group, group_name):
        return sys._getframe()

    assert stall._group_of(_new_process_group_helper(2, 0, [0, 2], "gloo", None, "7")) == ("7", (0, 2))
    assert stall._group_of(_new_process_group_helper(3, 0, [], "gloo", None, "0")) is None
    assert stall._group_of(other([0, 2], "7")) is None
    ns: dict = {}
    exec("def _new_process_group_helper(global_ranks_in_group):\n    import sys\n    return sys._getframe()", ns)
    assert stall._group_of(ns["_new_process_group_helper"]([0, 2])) is None


def test_a_store_wait_in_one_long_sleep_is_no_stall():
    """In a store wait, a main thread asleep from one look to the next (no voluntary context
    switch between: a TCPStore client's back-off between connects) wakes by itself: not still;
    rank 0's server polling for its clients (10 ms sleeps: switches every look) is."""
    from simdist.script.rank import stall

    init = stall.StoreWait("init_process_group", ("x.py", 3), 1800.0)

    def look(switches, sleep=True, store=init):
        return stall.Observation(True, ((), 0, 0, store), True, 1800.0, 0.0, 0.0, store, sleep, switches)

    assert not stall._still(look(7), look(7), 0.1)  # one sleep throughout
    assert stall._still(look(7), look(19), 0.1)  # polling: short sleeps
    assert stall._still(look(7), look(7, sleep=False), 0.1)  # in a poll or recv for a peer's key
    assert not stall._still(look(7), look(None), 0.1)  # cannot tell: no stall
    assert not stall._still(look(7), look(19, store=None), 0.1)  # another wait began


def test_which_threads_could_still_post():
    """`rank.threads`, the one rule of both sides: a thread asleep in `time.sleep` or in a
    `threading.Timer` (a timed wait) could post when it wakes; the standard library's plumbing
    in an untimed wait (a queue's feeder) and a thread the caller says waits in the backend
    cannot; simdist's own threads are not the script's unless named."""
    import time

    from simdist.script.rank import threads

    stop = threading.Event()
    sleeper = threading.Thread(target=time.sleep, args=(30,), daemon=True)  # standard library too, not a futex
    timer = threading.Timer(30, lambda: None)
    plumbing = threading.Thread(target=stop.wait, daemon=True)  # all standard library, untimed
    waiter = threading.Thread(target=lambda: stop.wait(), daemon=True)  # the caller's "backend wait"
    own = threading.Thread(target=lambda: stop.wait(30), name="simdist-test", daemon=True)
    for t in (sleeper, timer, plumbing, waiter, own):
        t.start()
    try:
        time.sleep(0.2)  # every thread in its wait
        me = threading.get_ident()
        mine = {t.ident for t in (sleeper, timer, plumbing, waiter, own)}  # other tests may leave threads
        running = mine & set(threads.running(lambda ident, _tid, _frame: ident == waiter.ident, skip=[me]))
        if threads.FUTEX_NR is not None and threads.syscall(plumbing.native_id) is not None:
            assert running == {sleeper.ident, timer.ident}
        else:  # no way to see a futex wait here: the plumbing counts as running (the watchdog decides)
            assert running == {sleeper.ident, timer.ident, plumbing.ident}
        assert own.ident in set(threads.running(lambda *_: False, skip=[me], own=[own.ident]))
    finally:
        timer.cancel()
        stop.set()


def test_a_claim_holds_only_once_the_rank_saw_every_completion_sent():
    """The coordinator's side of a rank's claim (`ranks.Claim`): a rank is quiet only when no
    thread could post, by a claim taken after it handled every completion sent to it (a
    completion sent since may have woken a thread the claim counts as waiting)."""
    from simdist.script.ranks import Claim

    c = Claim()
    c.told([1, 0], 1.0)
    assert not c.quiet()  # a thread could post
    c.told([0, 0], 2.0)
    assert c.quiet()
    c.sent += 1  # a completion went out: the claim may be stale
    assert not c.quiet()
    c.told([0, 1], 3.0)
    assert c.quiet() and c.at == 3.0


def test_a_threads_wait_counts_in_claims_only_once_its_message_has_gone(tmp_path):
    """The registration that makes a thread's wait count as "cannot post" in the rank's claims
    happens under the send lock with the message that says what it waits for (and its
    `Work.wait(timeout=)`). Before, it came first: another thread's claim taken in between
    reached the coordinator saying no thread could post, before the timed wait was known, and
    the coordinator proved a hang (tests/scripts/thread_wait_times_out.py, 1 run in ~15)."""
    from simdist.script.rank.client import Client

    server = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
    server.bind(str(tmp_path / "c.sock"))
    server.listen(1)
    c = Client(str(tmp_path / "c.sock"))
    peer, _ = server.accept()
    op = c.new_op(object())  # type: ignore[arg-type]
    got: list = []
    with c._send_lock:  # the message cannot go yet (another thread is sending)
        t = threading.Thread(target=lambda: got.append(c.send({"t": "wait", "id": op}, claim=True, register=[op])))
        t.start()
        t.join(0.2)
        assert t.is_alive() and t.ident not in c._waits  # not counted as waiting before its message
    t.join(5)
    header, _ = wire.recv(peer)
    assert header["t"] == "wait" and got == [frozenset({op})] and c._waits.get(t.ident) == frozenset({op})
    for s in (c.sock, peer, server):
        s.close()
