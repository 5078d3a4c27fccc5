"""The simulated process group: every operation torch routes to a process group goes to
the coordinator, whose engine pairs it with the other ranks' and computes the result.

torch uses a `ProcessGroup` subclass returned by a backend's creator as the group itself
(`_new_process_group_helper`), so C++ callers (DDP's reducer, `_broadcast_coalesced`,
`_verify_params_across_processes`) reach these methods through the pybind trampoline
(`PyProcessGroup.hpp`) and Python's `dist.*` functions call them directly. Methods take
torch's own argument shapes (tensor lists, options objects) and translate them into one
engine operation each: the op name and payload size conventions are the scenario's
(`simdist.vocab`), so the same program gives the same trace in both modes.

Inputs are sent at issue (the real backend reads them then too); a `SimWork` completes
when the coordinator answers, after copying the result bytes into the output tensors.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist
from torch.futures import Future

from simdist.script import env
from simdist.script.rank import client, stack
from simdist.vocab import DTYPE_BYTES

BACKEND_NAME = "simdist"


class UnsupportedOperation(RuntimeError):
    """An operation the simulated backend cannot model (named in the message)."""

    def __init__(self, what: str):
        super().__init__(env.UNSUPPORTED.format(what))


class SimWork(dist._Work):
    """torch's `Work` for a simulated op: `wait()` is a visible wait (the coordinator knows
    this rank now blocks on it); `get_future()` is what DDP's reducer waits on in C++."""

    def __init__(self, outputs: Sequence[torch.Tensor], result: Any):
        super().__init__()
        self.id = 0
        self._outputs = list(outputs)
        self._result = result
        self._done = threading.Event()
        self._lock = threading.Lock()
        self._error: str | None = None
        self._future: Future | None = None
        self.announced = False  # issued with asyncOp=False: the op message said its caller waits at once

    def complete(self, data: bytearray | None, error: str | None) -> None:
        """Called on the reader thread when the coordinator answers."""
        if error is None and data is not None:
            _fill(self._outputs, data)
        with self._lock:
            self._error = error
            self._done.set()
            fut = self._future
        if fut is not None:
            _settle(fut, self._result, error)

    def wait(self, timeout: Any = None) -> bool:
        c = client.CLIENT
        if c is None:
            self._done.wait()
        else:
            on_main = threading.current_thread() is threading.main_thread()
            if on_main:
                c.main_waits += 1
            try:
                if self.announced:
                    self.announced = False
                elif self._done.is_set():
                    # still told: the rank's simulated clock waits for the op whether or not
                    # its result happened to arrive first (reports must not depend on that race)
                    c.send({"t": "wait", "id": self.id, "cpu": time.thread_time()})
                else:
                    c.send({"t": "wait", "id": self.id, "cpu": time.thread_time(), "frames": stack.caller_stack()})
                self._done.wait()
            finally:
                if on_main:
                    c.main_waits -= 1
        if self._error is not None:
            raise RuntimeError(self._error)
        return True

    def get_future(self) -> Future:
        with self._lock:
            if self._future is not None:
                return self._future
            self._future = fut = Future()
            done = self._done.is_set()
        c = client.CLIENT
        if c is not None:
            c.send({"t": "fut", "id": self.id})  # a future is waited on (by C++ or Python)
        if done:
            _settle(fut, self._result, self._error)
        elif c is not None:
            c.future_requested(self.id)
        return fut

    def is_completed(self) -> bool:
        return self._done.is_set()

    def is_success(self) -> bool:
        return self._done.is_set() and self._error is None

    def exception(self) -> Any:
        return RuntimeError(self._error) if self._error is not None else None

    def result(self) -> Any:
        return self._result


# Errors of futures that C++ may be waiting on (DDP's reducer), raised by `raise_failed`.
FAILED_FUTURES: list[str] = []


def _settle(fut: Future, result: Any, error: str | None) -> None:
    """Complete a future. C++ consumers cannot see an error set from Python (torch's
    `set_exception` stores the exception as the value, which DDP's reducer would read as
    its bucket), so a failed future holds its result tensors for C++ and raises for Python
    readers; the error reaches C++ waiters when their backward returns (`raise_failed`)."""
    if error is not None:
        FAILED_FUTURES.append(error)

        def raise_error(_value: Any) -> None:
            if error in FAILED_FUTURES:
                FAILED_FUTURES.remove(error)
            raise RuntimeError(error)

        fut._set_unwrap_func(raise_error)
    fut.set_result(result)


def raise_failed() -> None:
    """Raise the first error of a failed future that no Python code has seen yet."""
    if FAILED_FUTURES:
        error = FAILED_FUTURES[0]
        FAILED_FUTURES.clear()
        raise RuntimeError(error)


def _fill(outputs: list[torch.Tensor], data: bytearray) -> None:
    """Copy the result bytes, in order, into the output tensors. Written through `.data`,
    like a backend writing memory: the tensors' autograd version counters stay as they are."""
    off = 0
    with torch.no_grad():
        for t in outputs:
            n = t.numel()
            if n:
                src = torch.frombuffer(data, dtype=t.dtype, count=n, offset=off)
                t.data.copy_(src.view(t.shape))
            off += n * t.element_size()


def _as_bytes(tensors: Sequence[torch.Tensor]) -> Any:
    views = [t.detach().contiguous().reshape(-1).view(torch.uint8).numpy() for t in tensors]
    if len(views) == 1:
        return views[0]
    return b"".join(v.tobytes() for v in views)


def dtype_name(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise UnsupportedOperation(f"a tensor of dtype {name}")
    return name


def _reduce_name(op: Any) -> str:
    for name, value in dist.ReduceOp.RedOpType.__members__.items():
        if op == value:
            if name == "PREMUL_SUM":
                break
            return name.lower()
    raise UnsupportedOperation(f"ReduceOp {op}")


def _numel(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors)


def _async(opts: Any) -> bool:
    return bool(getattr(opts, "asyncOp", True))


class SimProcessGroup(dist.ProcessGroup):
    """One simulated process group (WORLD or a `new_group`) as seen from this rank."""

    def __init__(self, rank: int, size: int, name: str, global_ranks: list[int]):
        super().__init__(rank, size)
        self.sim_name = name
        self.global_ranks = global_ranks

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        return BACKEND_NAME

    # ------------------------------------------------------------------ issuing
    def _issue(self, op: str, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], result: Any, *,
               numel: int, dtype: str, send: bool = True, reduce_op: str | None = None, root: int | None = None,
               peer: int | None = None, tag: int = 0, async_op: bool = True) -> SimWork:
        c = client.CLIENT
        if c is None:
            raise RuntimeError("simdist: this process is not a simulated rank (no coordinator connection)")
        work = SimWork(outputs, result)
        work.id = c.new_op(work)
        work.announced = not async_op
        header = {"t": "op", "id": work.id, "g": self.sim_name, "op": op, "n": numel, "dt": dtype, "ro": reduce_op,
                  "root": root, "peer": peer, "tag": tag, "async": async_op, "want": bool(outputs), "cpu": time.thread_time(),
                  "frames": stack.caller_stack(2)}
        c.send(header, [_as_bytes(inputs)] if send and inputs else [])
        return work

    def _root(self, opts: Any) -> int:
        return self.global_ranks[opts.rootRank]

    # ------------------------------------------------------------------ all-reduce, broadcast, reduce
    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        opts = opts or dist.AllreduceOptions()
        return self._issue("all_reduce", tensors, tensors, tensors, numel=_numel(tensors), dtype=dtype_name(tensors[0]),
                           reduce_op=_reduce_name(opts.reduceOp), async_op=_async(opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        return self.allreduce(tensors, opts)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        opts = opts or dist.BroadcastOptions()
        is_root = opts.rootRank == self.rank()
        return self._issue("broadcast", tensors, [] if is_root else tensors, tensors, numel=_numel(tensors),
                           dtype=dtype_name(tensors[0]), send=is_root, root=self._root(opts), async_op=_async(opts))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        opts = opts or dist.ReduceOptions()
        is_root = opts.rootRank == self.rank()
        return self._issue("reduce", tensors, tensors if is_root else [], tensors, numel=_numel(tensors),
                           dtype=dtype_name(tensors[0]), reduce_op=_reduce_name(opts.reduceOp), root=self._root(opts),
                           async_op=_async(opts))

    # ------------------------------------------------------------------ gathers and scatters
    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        if len(inputs) != 1:
            return self.allgather_coalesced(output_lists, inputs, opts)
        return self._issue("all_gather", inputs, output_lists[0], output_lists, numel=inputs[0].numel(),
                           dtype=dtype_name(inputs[0]), async_op=_async(opts))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> SimWork:
        # one collective over every input; the gathered bytes are rank-major
        outputs = [output_lists[k][r] for r in range(self.size()) for k in range(len(inputs))]
        return self._issue("all_gather", inputs, outputs, output_lists, numel=_numel(inputs),
                           dtype=dtype_name(inputs[0]), async_op=_async(opts))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        return self._issue("all_gather", [input], [output], [output], numel=input.numel(), dtype=dtype_name(input),
                           async_op=_async(opts))

    _allgather_base = all_gather_single

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> SimWork:
        flat = [o.reshape(-1) for o in outputs]
        parts = [flat[k].narrow(0, r * inputs[k].numel(), inputs[k].numel())
                 for r in range(self.size()) for k in range(len(inputs))]
        return self._issue("all_gather", inputs, parts, outputs, numel=_numel(inputs), dtype=dtype_name(inputs[0]),
                           async_op=_async(opts))

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def reduce_scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]],
                       opts: Any = None) -> SimWork:
        opts = opts or dist.ReduceScatterOptions()
        ins = input_lists[0]
        if len(outputs) != 1 or any(t.numel() != outputs[0].numel() for t in ins):
            raise UnsupportedOperation("reduce_scatter with uneven or several outputs")
        return self._issue("reduce_scatter", ins, outputs, outputs, numel=_numel(ins), dtype=dtype_name(outputs[0]),
                           reduce_op=_reduce_name(opts.reduceOp), async_op=_async(opts))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        opts = opts or dist.ReduceScatterOptions()
        return self._issue("reduce_scatter", [input], [output], [output], numel=input.numel(), dtype=dtype_name(input),
                           reduce_op=_reduce_name(opts.reduceOp), async_op=_async(opts))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> SimWork:
        raise UnsupportedOperation("reduce_scatter_tensor_coalesced")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        opts = opts or dist.GatherOptions()
        outs = output_lists[0] if opts.rootRank == self.rank() and output_lists else []
        return self._issue("gather", inputs, outs, output_lists, numel=_numel(inputs), dtype=dtype_name(inputs[0]),
                           root=self._root(opts), async_op=_async(opts))

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> SimWork:
        opts = opts or dist.ScatterOptions()
        is_root = opts.rootRank == self.rank()
        ins = input_lists[0] if is_root and input_lists else []
        return self._issue("scatter", ins, outputs, outputs, numel=outputs[0].numel() * self.size(),
                           dtype=dtype_name(outputs[0]), send=is_root, root=self._root(opts), async_op=_async(opts))

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        if len({t.numel() for t in inputs} | {t.numel() for t in outputs}) > 1:
            raise UnsupportedOperation("all_to_all with tensors of different sizes")
        return self._issue("all_to_all", inputs, outputs, outputs, numel=_numel(inputs), dtype=dtype_name(inputs[0]),
                           async_op=_async(opts))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                          input_splits: list[int], opts: Any = None) -> SimWork:
        if len(set(output_splits)) > 1 or len(set(input_splits)) > 1:
            raise UnsupportedOperation("all_to_all_single with uneven split sizes")
        return self._issue("all_to_all", [input], [output], [output], numel=input.numel(), dtype=dtype_name(input),
                           async_op=_async(opts))

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> SimWork:
        return self._issue("barrier", [], [], [], numel=0, dtype=env.BARRIER_DTYPE, async_op=_async(opts))

    # ------------------------------------------------------------------ point-to-point
    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> SimWork:
        return self._issue("send", tensors, [], tensors, numel=_numel(tensors), dtype=dtype_name(tensors[0]),
                           peer=self.global_ranks[dst], tag=tag)

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> SimWork:
        return self._issue("recv", [], tensors, tensors, numel=_numel(tensors), dtype=dtype_name(tensors[0]),
                           send=False, peer=self.global_ranks[src], tag=tag)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> SimWork:
        raise UnsupportedOperation("recv from any source (dist.recv without src)")


def create(opts: Any, backend_options: Any = None) -> SimProcessGroup:
    """The backend creator torch calls for WORLD and for each `new_group` (members only)."""
    given = list(opts.global_ranks_in_group)
    ranks = given or list(range(opts.group_size))
    name = env.group_name(str(opts.group_id), not given)
    if given and client.CLIENT is not None:
        client.CLIENT.send({"t": "group", "g": name, "ranks": ranks})
    return SimProcessGroup(opts.group_rank, opts.group_size, name, ranks)


def register() -> None:
    if BACKEND_NAME not in dist.Backend.backend_list:
        dist.Backend.register_backend(BACKEND_NAME, create, extended_api=True, devices=["cpu", "cuda"])
