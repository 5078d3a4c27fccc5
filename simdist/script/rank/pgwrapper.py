"""A simulated group made under TORCH_DISTRIBUTED_DEBUG=DETAIL: c10d's ProcessGroupWrapper.

On Gloo torch 2.13 wraps each group's backend in ProcessGroupWrapper, with a helper Gloo
group of the same members on the store prefix "pg_wrapper:<group name>"
(`distributed_c10d._create_process_group_wrapper`). Before each collective (not send/recv,
not monitored_barrier) the wrapper, on the helper group: runs a monitored barrier that waits
for every rank (`wait_all_ranks`, the group's timeout), then all-gathers the length of its
serialised fingerprint (an `all_gather[1] int64`) and the fingerprint (`all_gather[n] int64`),
and raises "Detected mismatch between collectives on ranks" on each rank that sees a peer's
value differ from its own (`fingerprint`). The monitored barrier's errors reach the caller as
Gloo words them (the wrapper re-words only a std::runtime_error, which c10's errors are not:
measured, a peer that exited left rank 0 with "[Rank 0]: Ranks 2 failed to pass
monitoredBarrier in 1800000 ms").

The sequence number in a fingerprint is the Gloo group's own count of the operations this
rank issued on it (`SimProcessGroup.gloo_seq`): every Gloo operation, p2p ones and a
monitored barrier's messages included (measured: after a send from rank 0 to rank 1 in a
group of 3, rank 2's next collective mismatched on "Sequence number: 1vs 2",
tests/scripts/debug_detail.py --case p2p; a monitored_barrier counts 2(n-1) on rank 0 and 2
elsewhere, read with `_get_sequence_number_for_group`).

The helper's operations are real operations of the run (the engine pairs them; a rank that
never comes leaves its peers in the helper's barrier); their Flight Recorder entries, like
the wrapped group's own, carry no group name (`simdist.script.detail` labels them "pg").
"""

from __future__ import annotations

import functools
import os
import signal
import sys
from collections.abc import Callable
from datetime import timedelta
from typing import Any

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import AllgatherOptions

from simdist.script import env
from simdist.script.rank import client
from simdist.script.rank.fingerprint import FingerPrint, UnknownOpType, mismatch_message
from simdist.script.rank.pg import SimProcessGroup, UnsupportedOperation

HELPER_PREFIX = "pg_wrapper"  # torch's PG_WRAPPER_STORE_PREFIX
# The assert opTypeToString fails on a peer length that is no OpType (measured: torch 2.13's build
# path; a 14-dim all_reduce's fingerprint of 20 values read by a peer)
_UNKNOWN_OP = ('false INTERNAL ASSERT FAILED at "/__w/pytorch/pytorch/torch/csrc/distributed/c10d/ProcessGroup.cpp":59, '
               "please report a bug to PyTorch. Unknown op type!")


def helper_name(group: str) -> str:
    """The simulated name of a group's helper Gloo group (the coordinator pairs its ops by it)."""
    return f"{group}:{HELPER_PREFIX}"


def _all(tensors: list[torch.Tensor]) -> list[torch.Tensor]:
    return list(tensors)


def _same_size(tensors: list[torch.Tensor]) -> bool:
    return all(t.shape == tensors[0].shape for t in tensors)


# What each collective of the wrapper checks (ProcessGroupWrapper.cpp): the op type and the
# tensors of its fingerprint, from the method's arguments. None: not checked (send, recv).
_CHECKS: dict[str, tuple[str, Callable[..., list[torch.Tensor]]]] = {
    "broadcast": ("BROADCAST", lambda tensors, *_: _all(tensors)),
    "allreduce": ("ALLREDUCE", lambda tensors, *_: _all(tensors)),
    "allreduce_coalesced": ("ALLREDUCE_COALESCED", lambda *_: []),
    "reduce": ("REDUCE", lambda tensors, *_: _all(tensors)),
    "allgather": ("ALLGATHER", lambda outs, ins, *_: _all(ins) if _same_size(outs[-1]) else []),
    "allgather_coalesced": ("ALLGATHER_COALESCED", lambda *_: []),
    "all_gather_single": ("_ALLGATHER_BASE", lambda out, inp, *_: [inp]),
    "_allgather_base": ("_ALLGATHER_BASE", lambda out, inp, *_: [inp]),
    "gather": ("GATHER", lambda outs, ins, *_: _all(ins)),
    "scatter": ("SCATTER", lambda outs, ins, *_: _all(outs)),
    "reduce_scatter": ("REDUCE_SCATTER", lambda outs, ins, *_: _all(outs) if _same_size(ins[-1]) else []),
    "reduce_scatter_single": ("_REDUCE_SCATTER_BASE", lambda out, inp, *_: [inp, out]),
    "_reduce_scatter_base": ("_REDUCE_SCATTER_BASE", lambda out, inp, *_: [inp, out]),
    "reduce_scatter_single_coalesced": ("REDUCE_SCATTER_TENSOR_COALESCED", lambda *_: []),
    "reduce_scatter_tensor_coalesced": ("REDUCE_SCATTER_TENSOR_COALESCED", lambda *_: []),
    "alltoall": ("ALLTOALL", lambda *_: []),
    "all_to_all_single": ("ALLTOALL_BASE", lambda *_: []),
    "alltoall_base": ("ALLTOALL_BASE", lambda *_: []),
    "barrier": ("BARRIER", lambda *_: []),
}


class DetailGroup(SimProcessGroup):
    """A simulated group that runs the wrapper's checks before each collective."""

    def __init__(self, rank: int, size: int, name: str, global_ranks: list[int], timeout: timedelta):
        super().__init__(rank, size, name, global_ranks)
        self.helper = SimProcessGroup(rank, size, helper_name(name), global_ranks)
        self.timeout = timeout
        self._inside = False  # a collective the wrapper checked runs (it may call another method)

    def _checked(self, op: str, tensors: list[torch.Tensor], call: Callable[[], Any]) -> Any:
        if self._inside:
            return call()
        self._run_checks(op, tensors)
        self._inside = True
        try:
            return call()
        finally:
            self._inside = False

    def _run_checks(self, op: str, tensors: list[torch.Tensor]) -> None:
        """ProcessGroupWrapper::runCollectiveChecks."""
        try:
            mine = FingerPrint.of(op, tensors, self.gloo_seq)
        except KeyError as e:
            raise UnsupportedOperation(f"a tensor of dtype {str(e.args[0]).removeprefix('torch.')}") from None
        self.helper.monitored_barrier(self.timeout, wait_all_ranks=True)
        values = mine.serialize()
        self._verify(mine, torch.tensor([len(values)], dtype=torch.int64))
        self._verify(mine, torch.tensor(values, dtype=torch.int64))

    def _verify(self, mine: FingerPrint, tensor: torch.Tensor) -> None:
        """verify_tensors: all-gather `tensor` on the helper; raise at the first rank whose differs."""
        outputs = [torch.zeros_like(tensor) for _ in range(self.size())]
        opts = AllgatherOptions()
        opts.asyncOp = False
        self.helper.allgather([outputs], [tensor], opts).wait()
        for peer, theirs in enumerate(outputs):
            if not torch.equal(theirs, tensor):
                try:
                    message = mismatch_message(self.rank(), mine, peer, FingerPrint.deserialize(theirs.tolist()))
                except UnknownOpType:
                    message = _UNKNOWN_OP
                raise RuntimeError(message)


def _install_checks() -> None:
    for name, (op, pick) in _CHECKS.items():
        base = getattr(SimProcessGroup, name)

        def method(self: DetailGroup, *args: Any, _base: Any = base, _op: str = op, _pick: Any = pick,
                   **kwargs: Any) -> Any:
            return self._checked(_op, _pick(*args), functools.partial(_base, self, *args, **kwargs))

        method.__name__ = name
        setattr(DetailGroup, name, method)


_install_checks()


def crash_ddp_logger() -> None:
    """DDP's constructor on a DETAIL group: torch 2.13's `Logger.set_construction_data_and_log`
    reads the group's backend as a ProcessGroupGloo, which the wrapper is not, and the process
    dies by SIGSEGV (measured with plain torchrun: every rank, after the constructor's parameter
    check and broadcast). A simulated rank dies the same way there, having told the
    coordinator why (`script.detail`); on a group that is not wrapped the logger runs."""
    orig = dist.Logger.set_construction_data_and_log
    if getattr(orig, "_simdist_detail", False):
        return

    @functools.wraps(orig)
    def set_construction_data_and_log(self: Any, *args: Any) -> Any:
        ddp = sys._getframe(1).f_locals.get("self")
        if isinstance(getattr(ddp, "process_group", None), DetailGroup):
            _die_by_segv()
        return orig(self, *args)

    set_construction_data_and_log._simdist_detail = True  # type: ignore[attr-defined]
    dist.Logger.set_construction_data_and_log = set_construction_data_and_log


def _die_by_segv() -> None:
    c = client.CLIENT
    if c is not None and not SimProcessGroup._gloo():
        raise UnsupportedOperation("DistributedDataParallel under TORCH_DISTRIBUTED_DEBUG=DETAIL with NCCL "
                                   "(measured on Gloo only: there it dies by SIGSEGV)")
    if c is not None:
        c.send({"t": "note", "x": env.SEGV_DDP_DETAIL})
    signal.signal(signal.SIGSEGV, signal.SIG_DFL)
    os.kill(os.getpid(), signal.SIGSEGV)
