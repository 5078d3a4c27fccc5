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

import functools
import time
from collections.abc import Sequence
from typing import Any

import torch
import torch.distributed as dist

from simdist.script import env
from simdist.script.rank import callbacks, client, gloo_args, gpu_memory, monitored, stack
from simdist.script.rank.gloo_args import shape_text
from simdist.script.rank.work import SimWork, SimWorks
from simdist.vocab import DTYPE_BYTES, PREMUL_SUM, gloo_empty_is_local, gloo_refusal

BACKEND_NAME = "simdist"


class UnsupportedOperation(RuntimeError):
    """An operation the simulated backend cannot model (named in the message)."""

    def __init__(self, what: str):
        super().__init__(env.UNSUPPORTED.format(what))


def _as_bytes(tensors: Sequence[torch.Tensor]) -> Any:
    views = [gpu_memory.host_numpy(t.detach().contiguous().reshape(-1).view(torch.uint8)) for t in tensors]
    if len(views) == 1:
        return views[0]
    return b"".join(v.tobytes() for v in views)


def dtype_name(t: torch.Tensor) -> str:
    name = str(t.dtype).removeprefix("torch.")
    if name not in DTYPE_BYTES:
        raise UnsupportedOperation(f"a tensor of dtype {name}")
    return name


def reduce_label(op: Any) -> str | None:
    """torch's name of a ReduceOp, lower case (`sum`, `premul_sum`, ...); None for none."""
    return next((name.lower() for name, value in dist.ReduceOp.RedOpType.__members__.items() if op == value), None)


def reduce_name(op: Any) -> str:
    """The simulator's name of a torch ReduceOp (`sum`, `avg`, ...). PREMUL_SUM is NCCL's:
    Gloo takes the work and fails it at `wait()` (`engine.results.gloo_local_error`), which
    the model follows; under NCCL semantics it is not modelled."""
    name = reduce_label(op)
    if name is None or (name == PREMUL_SUM and not SimProcessGroup._gloo()):
        raise UnsupportedOperation(f"ReduceOp {name or op}")
    return name


def _numel(tensors: Sequence[torch.Tensor]) -> int:
    return sum(t.numel() for t in tensors)


def _element_splits(t: torch.Tensor, rows: list[int], size: int) -> list[int]:
    """all_to_all_single's split sizes (rows of dim 0; none: equal parts) as element counts."""
    if not rows:
        return [t.numel() // size] * size
    per_row = t.numel() // t.shape[0] if t.dim() and t.shape[0] else 1
    return [int(n) * per_row for n in rows]


def _gloo_value(output_lists: list[list[torch.Tensor]]) -> Any:
    """A work's future value as ProcessGroupGloo gives it (`returnFutureWithOutput`): its
    outputs as a list of lists, or the one list when there is one."""
    return output_lists[0] if len(output_lists) == 1 else output_lists


def _futureless(work: SimWork | SimWorks, gloo: bool, completed: str = "at_wait") -> SimWork | SimWorks:
    """Gloo's works for p2p and reduce_scatter (torch 2.13) have no future: `get_future()`
    raises; and `is_completed()` says what those works say (`SimWork.completed_view`,
    measured): a send's or receive's True only once `wait()` returned, a reduce-scatter's
    never (its `is_success()` is True after the wait all the same)."""
    for w in work.parts if isinstance(work, SimWorks) else [work]:
        w.futureless = gloo
        w.completed_view = completed if gloo else "op"
    return work


def _async(opts: Any) -> bool:
    return bool(getattr(opts, "asyncOp", True))


class SimProcessGroup(dist.ProcessGroup):
    """One simulated process group (WORLD or a `new_group`) as seen from this rank."""

    def __init__(self, rank: int, size: int, name: str, global_ranks: list[int]):
        super().__init__(rank, size)
        self.sim_name = name
        self.global_ranks = global_ranks
        # Gloo's sequence number of the group on this rank: every op it issued, p2p included (`pgwrapper`)
        self.gloo_seq = 0

    def getBackendName(self) -> str:  # noqa: N802 - torch's name
        # C++ callers must not see "gloo": DDP's logger then casts the group's Gloo backend
        # (`getBackend(GLOO)`), which a group that is its own backend has none of
        return BACKEND_NAME

    def _get_backend_name(self) -> str:
        """The backend the run models ("gloo", "nccl"), as a real group of it answers Python's
        `_get_backend_name()` and `name()`: torch's Python branches on it (a ShardedTensor with
        no local shard is on the CPU under "gloo", else on `torch.device(current_device())`:
        FSDP's sharded state dict of a small layer on 8 ranks; SyncBatchNorm's gather). Which
        groups are simulated is told by the backend string torch keeps for each (`get_backend`'s
        "simdist"), not by this."""
        c = client.CLIENT
        return c.semantics if c is not None else BACKEND_NAME

    name = _get_backend_name

    # A group torch made from a registered backend lists the devices its backends serve, and
    # Python code branches on them (dcp.async_save wants "cpu", _state_dict_utils takes the
    # first): a Gloo group lists cuda and cpu (torch 2.13, also on a CPU-only build). This
    # group is its own backend for each (torch registers none on a group that is one).
    @property
    def _device_types(self) -> list[torch.device]:
        return [torch.device("cuda"), torch.device("cpu")]

    def _get_backend(self, device: Any) -> SimProcessGroup:
        return self

    # torch names every group (`_new_process_group_helper` -> `_set_group_name`) and reads it
    # back (`destroy_process_group(group)`, `_resolve_process_group`); C++ keeps the name on the
    # registered backends, which a group that is its own backend has none of ("ProcessGroup
    # name not set"), so the name is kept here
    def _set_group_name(self, name: str) -> None:
        self._sim_group_name = name

    @property
    def group_name(self) -> str:
        name = getattr(self, "_sim_group_name", None)
        if name is None:
            raise RuntimeError("ProcessGroup name not set")
        return name

    # ------------------------------------------------------------------ issuing
    def _issue(self, op: str, inputs: Sequence[torch.Tensor], outputs: Sequence[torch.Tensor], result: Any, *,
               numel: int, dtype: str, send: bool = True, reduce_op: str | None = None, root: int | None = None,
               peer: int | None = None, tag: int = 0, async_op: bool = True, announce: bool | None = None,
               splits: tuple[list[int], list[int], bool] | None = None, after: Any = None,
               frames: list | None = None, limit_s: float | None = None, hidden: str | None = None) -> SimWork:
        """Send one operation to the coordinator. `announce`: the op message says the caller
        waits on it at once (default: a synchronous call); `splits`: all_to_all's element
        counts (to each rank, from each rank) and whether the caller gave them; `after`: run once the outputs hold the result."""
        c = client.CLIENT
        if c is None:
            raise RuntimeError("simdist: this process is not a simulated rank (no coordinator connection)")
        work = SimWork(outputs, result, after)
        self.gloo_seq += 1
        # what Gloo runs without the wire completes here at once, as Gloo's worker thread
        # does it (callbacks run where `then` is called), unless Gloo refuses its op or dtype first
        local = gloo_empty_is_local(op, numel) and self._gloo() and gloo_refusal(op, reduce_op, dtype) is None
        work.id = c.new_op(work, track=not local)
        work.announced = not async_op if announce is None else announce
        header = {"t": "op", "id": work.id, "g": self.sim_name, "op": op, "n": numel, "dt": dtype, "ro": reduce_op,
                  "root": root, "peer": peer, "tag": tag, "async": async_op, "wait": work.announced,
                  "want": bool(outputs), "cpu": time.thread_time(), "frames": frames or stack.caller_stack(2)}
        if splits is not None:
            header["splits"] = splits
        if limit_s is not None:  # its own deadline (`simdist.script.deadlines`), not its group's
            header["to"] = limit_s
        if hidden:  # the torch call whose own message it is, below Python and the Flight Recorder
            header["hidden"] = hidden  # on Gloo (`monitored`): not in the trace
        # announced: the caller waits at once, until the op completes (its `wait` ends it)
        c.send(header, [_as_bytes(inputs)] if send and inputs else [], claim=work.announced,
               register=[work.id] if work.announced and not local else None)
        # issued from a callback, which may wait on it next: later completions go to a fresh
        # runner, only now that this op is sent (one of theirs must not reach the wire first)
        callbacks.RUNNERS.park()
        if local:
            work.complete(bytearray(), None)
        return work

    def _get_sequence_number_for_group(self) -> int:
        """ProcessGroupGloo's count of the operations this rank issued on the group (the
        group's and its backend's answer alike; measured on real Gloo, world sizes 2 and 3,
        tests/scripts/sequence_numbers.py): every op the rank runs on Gloo, each part of one Gloo
        runs as several. Under NCCL's semantics the simulated group keeps torch's refusal:
        NCCL's numbering is not measured here."""
        if not self._gloo():
            return super()._get_sequence_number_for_group()
        return self.gloo_seq

    @staticmethod
    def _gloo() -> bool:
        """Whether the run models Gloo, which runs some ops as others (reduce_scatter)."""
        c = client.CLIENT
        return c is None or c.semantics == "gloo"

    def _root(self, opts: Any) -> int:
        return self.global_ranks[opts.rootRank]

    # ------------------------------------------------------------------ all-reduce, broadcast, reduce
    def _memory(self, tensors: list[torch.Tensor]) -> list[torch.Tensor]:
        """The memory the backend works on for tensors it takes by pointer (`gloo_args.gloo_memory`)."""
        if not self._gloo():
            return tensors
        raw = [gloo_args.gloo_memory(t) for t in tensors]
        if any(r is None for r in raw):
            raise UnsupportedOperation("a non-contiguous tensor whose numel elements from its start run past its "
                                       "storage (Gloo reads and writes that memory)")
        return raw  # type: ignore[return-value]

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        opts = opts or dist.AllreduceOptions()
        raw = self._memory(tensors)
        return self._issue("all_reduce", raw, raw, tensors, numel=_numel(tensors), dtype=dtype_name(tensors[0]),
                           reduce_op=reduce_name(opts.reduceOp), async_op=_async(opts))

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        # ProcessGroupGloo all-reduces one flat copy of the tensors and copies it back after:
        # an all_reduce that fails after it ran (integer AVG) leaves the tensors as they were
        opts = opts or dist.AllreduceCoalescedOptions()
        flat = torch.empty(_numel(tensors), dtype=tensors[0].dtype)

        def copy_back() -> None:
            off = 0
            for t in tensors:
                t.data.copy_(flat.narrow(0, off, t.numel()).view(t.shape))
                off += t.numel()

        return self._issue("all_reduce", tensors, [flat], tensors, numel=_numel(tensors), dtype=dtype_name(tensors[0]),
                           reduce_op=reduce_name(opts.reduceOp), async_op=_async(opts), after=copy_back)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        opts = opts or dist.BroadcastOptions()
        is_root = opts.rootRank == self.rank()
        raw = self._memory(tensors)
        return self._issue("broadcast", raw, [] if is_root else raw, tensors, numel=_numel(tensors),
                           dtype=dtype_name(tensors[0]), send=is_root, root=self._root(opts), async_op=_async(opts))

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> SimWork:
        opts = opts or dist.ReduceOptions()
        # every rank's tensor changes: Gloo reduces in place, non-roots keep partial sums
        raw = self._memory(tensors)
        return self._issue("reduce", raw, raw, tensors, numel=_numel(tensors),
                           dtype=dtype_name(tensors[0]), reduce_op=reduce_name(opts.reduceOp), root=self._root(opts),
                           async_op=_async(opts))

    # ------------------------------------------------------------------ gathers and scatters
    def allgather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        if len(inputs) != 1:  # output_lists[k][r] here, [r][k] in the coalesced form
            return self.allgather_coalesced([list(per_rank) for per_rank in zip(*output_lists, strict=True)], inputs, opts)
        if self._gloo():
            gloo_args.allgather_check(output_lists[0], inputs[0], self.size())
        return self._issue("all_gather", inputs, output_lists[0], _gloo_value(output_lists), numel=inputs[0].numel(),
                           dtype=dtype_name(inputs[0]), async_op=_async(opts))

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> SimWork:
        # one collective over every input; bytes and lists rank-major (output_lists[r][k]: rank r's input k)
        outputs = [output_lists[r][k] for r in range(self.size()) for k in range(len(inputs))]
        return self._issue("all_gather", inputs, outputs, _gloo_value(output_lists), numel=_numel(inputs),
                           dtype=dtype_name(inputs[0]), async_op=_async(opts))

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        if self._gloo():  # ProcessGroupGloo::_allgather_base: the list form on output.chunk(size)
            gloo_args.allgather_check(output.chunk(self.size()) if output.dim() else [output], input, self.size())
        value = list(output.chunk(self.size())) if self._gloo() and output.dim() else [output]
        return self._issue("all_gather", [input], [output], value, numel=input.numel(), dtype=dtype_name(input),
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
                       opts: Any = None) -> SimWork | SimWorks:
        opts = opts or dist.ReduceScatterOptions()
        ins, red = input_lists[0], reduce_name(opts.reduceOp)
        if len(outputs) != 1:
            raise UnsupportedOperation("reduce_scatter with several outputs")
        if self._gloo():
            if any(not t.is_contiguous() for t in [*ins, *outputs]):
                # Gloo works on their raw memory in a way not measured here (neither all_reduce's
                # nor a copy's result): say so rather than guess
                raise UnsupportedOperation("reduce_scatter (list form) with a non-contiguous tensor on Gloo")
            # ProcessGroupGloo (torch 2.13) runs it as one all_reduce per input, in rank
            # order (the Flight Recorder shows them); each rank keeps the one of its own index
            frames = stack.caller_stack(1)
            parts = [self._issue("all_reduce", [t], outputs if k == self.rank() else [], outputs, numel=t.numel(),
                                 dtype=dtype_name(t), reduce_op=red, async_op=_async(opts), announce=False,
                                 frames=frames)
                     for k, t in enumerate(ins)]
            return _futureless(SimWorks(parts, outputs), True, "never")
        if any(t.numel() != outputs[0].numel() for t in ins):
            raise UnsupportedOperation("reduce_scatter with uneven inputs")
        return self._issue("reduce_scatter", ins, outputs, outputs, numel=_numel(ins), dtype=dtype_name(outputs[0]),
                           reduce_op=red, async_op=_async(opts))

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> SimWork:
        opts = opts or dist.ReduceScatterOptions()
        red = reduce_name(opts.reduceOp)
        if self._gloo():
            if not gloo_args.reduce_scatter_check(output, input, self.size()):
                raise UnsupportedOperation("reduce_scatter_tensor with an output of more dims than its input "
                                           "(Gloo compares shapes past the input's: undefined)")
            # ProcessGroupGloo (torch 2.13): one all_reduce of a copy of the whole input; each
            # rank copies its chunk out in the work's wait() (the input is left as it was)
            stage, size, r = torch.empty_like(input), self.size(), self.rank()
            work = self._issue("all_reduce", [input], [stage], [output], numel=input.numel(),
                               dtype=dtype_name(input), reduce_op=red, async_op=_async(opts))
            work.at_wait = lambda: gloo_args.reduce_scatter_copy(output, stage, size, r)
            return _futureless(work, True, "never")
        return self._issue("reduce_scatter", [input], [output], [output], numel=input.numel(), dtype=dtype_name(input),
                           reduce_op=red, async_op=_async(opts))

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> SimWorks:
        """ProcessGroupGloo (torch 2.13), which `reduce_scatter_tensor` and sequence parallelism's
        functional collectives reach: every pair is checked first, then one all_reduce of a copy
        of each input is issued, in order; wait() waits on each and copies its chunk out."""
        opts = opts or dist.ReduceScatterOptions()
        if not self._gloo():
            raise UnsupportedOperation("reduce_scatter_tensor_coalesced under NCCL semantics")
        if len(outputs) != len(inputs):
            raise RuntimeError("requires input/output tensor lists to have the same length")
        for output, inp in zip(outputs, inputs, strict=True):
            if not gloo_args.reduce_scatter_check(output, inp, self.size()):
                raise UnsupportedOperation("reduce_scatter_tensor_coalesced with an output of more dims than its "
                                           "input (Gloo compares shapes past the input's: undefined)")
        red, size, r, frames = reduce_name(opts.reduceOp), self.size(), self.rank(), stack.caller_stack(1)
        parts = []
        for output, inp in zip(outputs, inputs, strict=True):
            stage = torch.empty_like(inp)
            work = self._issue("all_reduce", [inp], [stage], [output], numel=inp.numel(), dtype=dtype_name(inp),
                               reduce_op=red, async_op=_async(opts), announce=False, frames=frames)
            work.at_wait = functools.partial(gloo_args.reduce_scatter_copy, output, stage, size, r)
            parts.append(work)
        return _futureless(SimWorks(parts, outputs), True, "never")

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        opts = opts or dist.GatherOptions()
        outs = output_lists[0] if opts.rootRank == self.rank() and output_lists else []
        if self._gloo():
            gloo_args.sizes_check("gather", outs, inputs[0])
        return self._issue("gather", inputs, outs, _gloo_value(output_lists), numel=_numel(inputs), dtype=dtype_name(inputs[0]),
                           root=self._root(opts), async_op=_async(opts))

    def scatter(self, outputs: list[torch.Tensor], input_lists: list[list[torch.Tensor]], opts: Any = None) -> SimWork:
        opts = opts or dist.ScatterOptions()
        is_root = opts.rootRank == self.rank()
        if self._gloo() and is_root and input_lists:
            gloo_args.sizes_check("scatter", input_lists[0], outputs[0])
        ins = self._memory(input_lists[0]) if is_root and input_lists else []
        return self._issue("scatter", ins, self._memory(outputs), outputs, numel=outputs[0].numel() * self.size(),
                           dtype=dtype_name(outputs[0]), send=is_root, root=self._root(opts), async_op=_async(opts))

    def alltoall(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor], opts: Any = None) -> SimWork:
        if self._gloo():  # Gloo's list all_to_all takes equal tensors only (checked before anything is sent)
            want = tuple(inputs[0].shape)
            for k, t in [*enumerate(inputs), *enumerate(outputs)]:
                if tuple(t.shape) != want:
                    raise RuntimeError(f"ProcessGroupGloo::alltoall: invalid tensor size at index {k} "
                                       f"(expected {shape_text(want)}, got {shape_text(tuple(t.shape))})")
        splits = ([t.numel() for t in inputs], [t.numel() for t in outputs], False)
        return self._issue("all_to_all", inputs, outputs, outputs, numel=_numel(inputs), dtype=dtype_name(inputs[0]),
                           async_op=_async(opts), splits=splits)

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_splits: list[int],
                          input_splits: list[int], opts: Any = None) -> SimWork:
        if self._gloo():
            gloo_args.require_contiguous("Tensors must be contiguous", ValueError, input, output)
        splits = (_element_splits(input, input_splits, self.size()), _element_splits(output, output_splits, self.size()),
                  bool(input_splits or output_splits))
        return self._issue("all_to_all", [input], [output], [output], numel=input.numel(), dtype=dtype_name(input),
                           async_op=_async(opts), splits=splits)

    alltoall_base = all_to_all_single

    def barrier(self, opts: Any = None) -> SimWork:
        return self._issue("barrier", [], [], [], numel=0, dtype=env.BARRIER_DTYPE, async_op=_async(opts))

    def monitored_barrier(self, timeout: Any = None, wait_all_ranks: bool = False) -> None:
        """ProcessGroupGloo::monitoredBarrier, message for message: each rank sends rank 0 its
        rank and waits for rank 0's answer; rank 0 receives from every rank with a deadline
        (`timeout` from its start; with `wait_all_ranks`, the whole `timeout` for each wait in
        turn), names the first rank that missed it (every one, with `wait_all_ranks`), and
        answers only if all arrived. The deadlines are simulated (`simdist.script.deadlines`)."""
        monitored.barrier(self, timeout, wait_all_ranks)

    # ------------------------------------------------------------------ point-to-point
    def _p2p_check(self, tensors: list[torch.Tensor], peer: int | None = None) -> None:
        if self._gloo():  # ProcessGroupGloo's send and recv both say "input"
            gloo_args.require_contiguous("input tensor has to be contiguous", RuntimeError, *tensors)
            gloo_args.peer_check(self.rank(), peer)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> SimWork:
        self._p2p_check(tensors, dst)
        return _futureless(self._issue("send", tensors, [], tensors, numel=_numel(tensors),
                                       dtype=dtype_name(tensors[0]), peer=self.global_ranks[dst], tag=tag), self._gloo())

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> SimWork:
        self._p2p_check(tensors, src)
        return _futureless(self._issue("recv", [], tensors, tensors, numel=_numel(tensors),
                                       dtype=dtype_name(tensors[0]), send=False, peer=self.global_ranks[src],
                                       tag=tag), self._gloo())

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> SimWork:
        self._p2p_check(tensors)
        work = self._issue("recv", [], tensors, tensors, numel=_numel(tensors), dtype=dtype_name(tensors[0]),
                           send=False, peer=None, tag=tag)
        work.group_ranks = self.global_ranks
        return _futureless(work, self._gloo())

