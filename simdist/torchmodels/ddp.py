"""Model of `torch/nn/parallel/distributed.py` (DistributedDataParallel) and its C++ Reducer.

What it issues, in torch 2.13's order:
* construction: `_verify_param_shape_across_processes` (all_gather of the parameter count,
  broadcast of 2 x sum(dims) int64 shape/stride metadata), `_sync_module_states`
  (`_broadcast_coalesced` from rank 0 in 250 MiB buckets per dtype);
* `_pre_forward`: Join heartbeat, `reducer._rebuild_buckets()` (two int32 broadcasts from
  rank 0, once, when gradients were seen and buckets were never rebuilt), buffer sync,
  and the backward-sync flag all-reduce when Join is enabled;
* backward: one all-reduce per bucket in bucket order (one bucket in iteration 1 when
  `find_unused_parameters=False`, since the initial limit is `sys.maxsize`; rebuilt
  buckets in gradient-ready order after), then the local-used-map all-reduce with
  `find_unused_parameters`;
* `_DDPJoinHook.main_hook` / `post_hook` on a joined rank.

Gradient values are modelled for the chain model the real backend builds (every used
parameter's gradient is the input, 1.0, per backward), which is enough to show what
`divide_by_initial_world_size` does to the averaged gradient.
"""

from __future__ import annotations

import functools
from collections.abc import Generator
from typing import Any

from simdist.engine.calls import Work, wait_all
from simdist.engine.core import RankRaised
from simdist.engine.values import Payload
from simdist.torchmodels.buckets import (
    BROADCAST_BUCKET_SIZE,
    DEFAULT_BUCKET_CAP_MB,
    DEFAULT_FIRST_BUCKET_BYTES,
    MAXSIZE,
    MB,
    compute_bucket_assignment_by_size,
)
from simdist.torchmodels.dist import Dist
from simdist.torchmodels.join import ONE_F32, ZERO_F32, Join, Joinable, JoinHook
from simdist.vocab import WORLD

INPUT_VALUE = 1.0  # every input x is torch.ones(1) on the real backend
# torch 2.13's FutureWarning whenever `broadcast_buffers` is passed to DDP.
BROADCAST_BUFFERS_DEPRECATED = (
    "`broadcast_buffers` is deprecated. Use `forward_sync_buffers` instead. IMPORTANT: unlike "
    "`broadcast_buffers=False`, `forward_sync_buffers=False` still syncs buffers at init. If you rely on buffers "
    "NOT being synced at init (e.g. rank-local buffers), keep using `broadcast_buffers=False` until "
    "`init_sync_buffers` is available."
)

# What `dist._broadcast_coalesced` (pybind) raises for a source rank that is no C int. A source
# rank from a mismatched vote (`DDPModel._find_common_rank`) holds uninitialised bytes of Gloo's
# ring scratch buffer (`new uint8_t[]` in gloo/allreduce.cc): on torch 2.13+cpu they were the
# upper half of a heap pointer (0x00007f1b3f800000 where a float32 1.0 filled the lower half),
# far above INT_MAX, so the call is refused before any byte moves. Known limit: garbage that is
# zero or negative would give "invalid root rank" or the rank's own vote instead (docs/gloo-mismatch.md).
BAD_ROOT_MESSAGE = "_broadcast_coalesced(): incompatible function arguments. The following argument types are supported:"


def backward_shares(numels: list[int], used: list[bool], seconds: float) -> list[float]:
    """Each parameter's part of a backward that computes for `seconds`: the used parameters
    share it by element count (a layer's backward costs about as its size), unused ones get
    none. The real backend's chain model sleeps these (`real_backend.model`)."""
    total = sum(n for n, u in zip(numels, used, strict=True) if u)
    return [seconds * n / total if u and total else 0.0 for n, u in zip(numels, used, strict=True)]


class DDPModel(Joinable):
    """`DistributedDataParallel` around a chain model of parameters of `numels` elements
    (`dims` dimensions each) and buffers of `buffers` elements, all of `dtype`; the
    parameters listed in `unused_params` take no part in forward.

    On process group `group` (`process_group=`): every collective goes there, its world
    size divides the gradients, and the ranks DDP's C++ code names (the broadcast source 0,
    `_find_common_rank`'s) are ranks *of the group*, turned into global ranks only where
    the engine is called (`dist.members(group)[k]`), as c10d does."""

    def __init__(self, dist: Dist, numels: list[int], dims: list[int], dtype: str, buffers: list[int],
                 unused_params: list[int], *, group: str = WORLD, bucket_cap_mb: float | None = None,
                 find_unused_parameters: bool = False, broadcast_buffers: bool | None = None,
                 gradient_as_bucket_view: bool = False):
        """The rest as torch's `DistributedDataParallel(module, ...)` keyword arguments.
        (`gradient_as_bucket_view` changes no collective.)"""
        super().__init__()
        self.group = group
        self.members = dist.members(group)
        self.group_rank = self.members.index(dist.rank)
        if broadcast_buffers is not None:
            dist.warn(BROADCAST_BUFFERS_DEPRECATED)
            sync_buffers = broadcast_buffers
        else:
            sync_buffers = True
        self.dist = dist
        self.numels = list(numels)
        self.dims = list(dims)
        self.dtype = dtype
        self.buffer_numels = list(buffers)
        self.used = [i not in set(unused_params) for i in range(len(self.numels))]
        self.find_unused_parameters = find_unused_parameters
        self.forward_sync_buffers = sync_buffers
        self.init_sync_buffers = sync_buffers
        is_default = bucket_cap_mb is None
        cap_mb = DEFAULT_BUCKET_CAP_MB if bucket_cap_mb is None else bucket_cap_mb
        self.bucket_bytes_cap = int(cap_mb * MB)
        self.first_bucket_bytes_cap = DEFAULT_FIRST_BUCKET_BYTES if is_default else self.bucket_bytes_cap
        # BucketCapacityConfig.compute_bucket_size_limits (static_graph=False)
        if not self.find_unused_parameters:
            limits = [MAXSIZE]
        elif self.first_bucket_bytes_cap < self.bucket_bytes_cap:
            limits = [self.first_bucket_bytes_cap, self.bucket_bytes_cap]
        else:
            limits = [self.bucket_bytes_cap]
        initial = compute_bucket_assignment_by_size(self.numels, [self.dtype] * len(self.numels), limits)
        self.buckets: list[list[int]] = list(reversed(initial))
        self._bucket_of = _bucket_index(self.buckets)
        self._sizes = _bucket_sizes(self.buckets, self.numels)
        # the order autograd marks gradients ready (used ones last to first; with
        # find_unused_parameters the unused ones after, at the end of the backward): the same
        # every backward, so worked out once, like each backward's compute shares (`_shares`)
        self._ready = [i for i in reversed(range(len(self.numels))) if self.used[i]]
        if self.find_unused_parameters:
            self._ready += [i for i in reversed(range(len(self.numels))) if not self.used[i]]
        self._shares: tuple[float, list[float]] | None = None  # (seconds, backward_shares(...))
        self.has_rebuilt_bucket = False
        self.rebuilt_params: list[int] = []
        self.require_backward_grad_sync = True
        self.require_forward_param_sync = True
        self.divide_by_initial_world_size = True
        self.expect_autograd_hooks = False
        self.forward_work: Work | None = None
        self.grad: list[float | None] = [None] * len(self.numels)  # local .grad (uniform value)
        self.observed_grads: list[float | None] = []

    @property
    def join_dist(self) -> Dist:
        return self.dist

    @property
    def join_process_group(self) -> str:
        return self.group

    def _issue(self, op: str, t: Payload, *, origin: str, root: int | None = None, reduce_op: str | None = None,
               async_op: bool = False) -> Work:
        """A collective on DDP's process group; `root` is a rank of the group."""
        return self.dist.issue(op, t, origin=origin, group=self.group, reduce_op=reduce_op, async_op=async_op,
                               root=None if root is None else self.members[root])

    def _run(self, op: str, t: Payload, **kw: Any) -> Generator[Any, Any, Payload]:
        return (yield from self._issue(op, t, **kw).wait())

    # ------------------------------------------------------------------ construction
    def construct(self) -> Generator[Any, Any, None]:
        d = self.dist
        # _verify_params_across_processes: all_gather the parameter count, then the metadata.
        counts = yield from self._run("all_gather", Payload.full(1, "int64", len(self.numels)),
                                      origin="ddp.init.verify_params")
        arr = counts.array()
        if arr is not None and any(int(v) != len(self.numels) for v in arr.tolist()):  # (not numpy's scalars, one by one)
            raise RankRaised(
                "RuntimeError",
                f"DDP expects same model across all ranks, but Rank {d.rank} has {len(self.numels)} params, "
                "while another rank has an inconsistent number of params.",
                "model",
            )
        yield from self._run("broadcast", Payload.unknown(2 * sum(self.dims), "int64"), root=0,
                             origin="ddp.init.verify_params")
        # _sync_module_states(src=0)
        numels = self.numels + (self.buffer_numels if self.init_sync_buffers else [])
        yield from self._broadcast_coalesced(numels, 0, "ddp.init.sync_module_states")

    def _broadcast_coalesced(self, numels: list[int], root: int | None, origin: str) -> Generator[Any, Any, None]:
        """c10d `broadcast_coalesced`: one broadcast per 250 MiB bucket (per dtype); `root` is a group rank,
        None when `_find_common_rank` left it undefined (see there)."""
        if not numels:
            return
        if root is None or not -2**31 <= root < 2**31:  # no C int: pybind refuses the call
            raise RankRaised("TypeError", BAD_ROOT_MESSAGE, "model")
        if not 0 <= root < len(self.members):  # a vote that met another collective's bytes
            raise RankRaised("RuntimeError", f"ProcessGroupGloo::broadcast: invalid root rank: {root}")
        buckets = compute_bucket_assignment_by_size(numels, [self.dtype] * len(numels), [BROADCAST_BUCKET_SIZE])
        yield from wait_all([
            self._issue("broadcast", Payload.unknown(sum(numels[i] for i in b), self.dtype), origin=origin,
                        root=root, async_op=True)
            for b in buckets
        ])

    # ------------------------------------------------------------------ forward
    def forward(self, no_sync: bool = False) -> Generator[Any, Any, None]:
        """`DDP.forward` = `_pre_forward` + module forward + `_post_forward` (inside `no_sync()` if asked)."""
        if no_sync:
            self.require_backward_grad_sync = False
        try:
            yield from self._pre_forward()
            # _post_forward
            if self.require_backward_grad_sync:
                self.require_forward_param_sync = True
                self.expect_autograd_hooks = True  # reducer.prepare_for_backward
            else:
                self.require_forward_param_sync = False
        finally:
            if no_sync:
                self.require_backward_grad_sync = True

    def _pre_forward(self) -> Generator[Any, Any, None]:
        work = yield from Join.notify_join_context(self)
        self.forward_work = work  # reducer._set_forward_pass_work_handle
        if self.rebuilt_params:  # (else `_rebuild_buckets` returns at once: no generator for it)
            yield from self._rebuild_buckets("ddp.pre_forward.rebuild_buckets")
        if self._check_sync_bufs_pre_fwd():
            yield from self._sync_buffers()
        if self._join_config.enable:
            self._check_global_requires_backward_grad_sync(is_joined_rank=False)

    def _check_sync_bufs_pre_fwd(self) -> bool:
        return self.require_forward_param_sync and self.forward_sync_buffers and len(self.buffer_numels) > 0

    def _sync_buffers(self) -> Generator[Any, Any, None]:
        if self._join_config.enable:
            authoritative = yield from self._find_common_rank(self.group_rank, True, "ddp.pre_forward.find_common_rank")
        else:
            authoritative = 0
        yield from self._broadcast_coalesced(self.buffer_numels, authoritative, "ddp.pre_forward.sync_buffers")

    def _find_common_rank(self, input_rank: int, rank_cond: bool, origin: str) -> Generator[Any, Any, int | None]:
        """DDP's vote (all-reduce MAX of the rank, or -1). None: the result is undefined, because
        the all-reduce was mismatched and its bytes came partly from Gloo's uninitialised ring
        scratch buffer (`engine.gloo_rules.mixed_result`); torch then passes that garbage on as
        the broadcast's source rank, which `_broadcast_coalesced` refuses (`BAD_ROOT_MESSAGE`)."""
        res = yield from self._run("all_reduce", Payload.full(1, "int64", input_rank if rank_cond else -1),
                                   origin=origin, reduce_op="max")
        v = res.item()
        if v == -1:
            raise RankRaised(
                "ValueError",
                "BUG! Expected rank_cond to be true for at least one process. "
                "This indicates a bug in PyTorch, please report an issue.",
                "model",
            )
        return int(v) if v is not None else None

    def _check_global_requires_backward_grad_sync(self, is_joined_rank: bool, origin: str = "ddp.pre_forward.requires_grad_sync") -> Work:
        value = ONE_F32 if (not is_joined_rank and self.require_backward_grad_sync) else ZERO_F32
        return self._issue("all_reduce", value, origin=origin, async_op=True)

    # ------------------------------------------------------------------ reducer
    def _should_rebuild_buckets(self) -> bool:
        return not self.find_unused_parameters and not self.has_rebuilt_bucket

    def _rebuild_buckets(self, origin: str) -> Generator[Any, Any, bool]:
        """`Reducer::rebuild_buckets` + `sync_bucket_indices` (rank 0's layout wins)."""
        if not self._should_rebuild_buckets() or not self.rebuilt_params:
            return False
        order = self.rebuilt_params
        mine = compute_bucket_assignment_by_size(
            [self.numels[i] for i in order],
            [self.dtype] * len(order),
            [self.first_bucket_bytes_cap, self.bucket_bytes_cap],
            tensor_indices=order,
        )
        got = yield from self._run("broadcast", Payload.unknown(len(order) + 1, "int32", meta=mine), root=0,
                                   origin=origin)
        layout = got.meta if got.meta is not None else mine
        yield from self._run("broadcast", Payload.unknown(len(layout), "int32"), root=0, origin=origin)
        self.buckets = [list(b) for b in layout]
        self._bucket_of = _bucket_index(self.buckets)
        self._sizes = _bucket_sizes(self.buckets, self.numels)
        self.has_rebuilt_bucket = True
        self.rebuilt_params = []
        return True

    def _bucket_payload(self, bucket: list[int], values: dict[int, float | None]) -> Payload:
        """The flattened bucket: one run per parameter, in the bucket's layout order."""
        if any(values.get(i) is None for i in bucket):
            return Payload.unknown(sum(self.numels[i] for i in bucket), self.dtype)
        return Payload.runs([(self.numels[i], values[i]) for i in bucket], self.dtype)  # type: ignore[misc]

    def backward(self, seconds: float = 0.0) -> Generator[Any, Any, None]:
        """`loss.backward()`: autograd hooks mark params ready; buckets all-reduce in order.

        The backward computes for `seconds`, each used parameter's gradient ready after its
        share (`backward_shares`); a bucket is launched as soon as it and every bucket
        before it are ready (the Reducer's `mark_bucket_ready`), so its all-reduce runs
        while the rest of the backward computes."""
        if not self.expect_autograd_hooks:
            # no_sync (or no prepared forward): gradients accumulate locally, no communication.
            if seconds > 0:
                yield from self.dist.compute(seconds)
            for i, used in enumerate(self.used):
                if used:
                    self.grad[i] = (self.grad[i] or 0.0) + INPUT_VALUE
            self.observed_grads.append(self.grad[0])
            return
        self.expect_autograd_hooks = False
        # Reducer::set_divide_factor, at the first ready gradient.
        div = float(len(self.members))  # Reducer: process_group->getSize()
        if self.forward_work is not None and not self.divide_by_initial_world_size:
            hb = yield from self.forward_work.wait()
            v = hb.item()
            div = float(v) if v else div
        self.forward_work = None
        ready = self._ready
        contrib: dict[int, float | None] = {}
        if self._shares is None or self._shares[0] != seconds:
            self._shares = (seconds, backward_shares(self.numels, self.used, seconds))
        share = self._shares[1]
        left = [len(b) for b in self.buckets]  # parameters each bucket still waits for
        bucket_of = self._bucket_of
        works: list[tuple[list[int], Work]] = []
        record_order = self._should_rebuild_buckets()  # (the same for the whole backward)
        for i in ready:
            if share[i] > 0:
                yield from self.dist.compute(share[i])
            if self.used[i]:
                self.grad[i] = (self.grad[i] or 0.0) + INPUT_VALUE
                contrib[i] = self.grad[i] / div  # type: ignore[operator]
            else:
                contrib[i] = 0.0
            if record_order:
                self.rebuilt_params.append(i)
            left[bucket_of[i]] -= 1
            while len(works) < len(self.buckets) and left[len(works)] <= 0:
                b = self.buckets[len(works)]
                works.append((b, self._issue("all_reduce", self._bucket_payload(b, contrib),
                                             origin="ddp.backward.bucket_allreduce", async_op=True)))
        for b in self.buckets[len(works):]:  # (every parameter is in `ready`: none is left)
            works.append((b, self._issue("all_reduce", self._bucket_payload(b, contrib),
                                         origin="ddp.backward.bucket_allreduce", async_op=True)))
        unused_work = None
        if self.find_unused_parameters:
            used_map = Payload.from_array([1 if u else 0 for u in self.used], "int32") if len(self.used) <= 64 \
                else Payload.unknown(len(self.used), "int32")
            unused_work = self._issue("all_reduce", used_map, origin="ddp.backward.unused_map_allreduce", async_op=True)
        for (b, w), sizes in zip(works, self._sizes, strict=True):
            # (a bucket that has completed, as most have by now, without a `wait` generator)
            res = w.value if w.ok is True else (yield from w.wait())
            runs = res.run_values()
            per_param = _split_runs(tuple(runs), sizes) if runs is not None else None
            for k, i in enumerate(b):
                if self.used[i]:  # an unused parameter's .grad is left untouched (None)
                    self.grad[i] = per_param[k] if per_param is not None else None
        if unused_work is not None:
            yield from unused_work.wait()
        self.observed_grads.append(self.grad[0])

    def zero_grad(self) -> None:
        self.grad = [None] * len(self.numels)

    # ------------------------------------------------------------------ join
    def join_hook(self, **kwargs: Any) -> JoinHook:
        self.divide_by_initial_world_size = bool(kwargs.get("divide_by_initial_world_size", True))
        return _DDPJoinHook(self)

    def _push_all_rebuilt_params(self) -> None:
        if not self._should_rebuild_buckets() or self.rebuilt_params:
            return
        self.rebuilt_params = list(range(len(self.numels)))

    def _sync_final_model(self, is_last_joiner: bool) -> Generator[Any, Any, None]:
        root = yield from self._find_common_rank(self.group_rank, is_last_joiner, "ddp.post_hook.find_common_rank")
        numels = self.numels + (self.buffer_numels if self.forward_sync_buffers else [])
        yield from self._broadcast_coalesced(numels, root, "ddp.post_hook.broadcast_final_model")


def _bucket_index(buckets: list[list[int]]) -> dict[int, int]:
    """Parameter index -> the bucket it is in."""
    return {i: k for k, b in enumerate(buckets) for i in b}


def _bucket_sizes(buckets: list[list[int]], numels: list[int]) -> list[tuple[int, ...]]:
    """Each bucket's parameters' element counts (what `_split_runs` cuts a reduced bucket by),
    worked out when the buckets are made, not per backward."""
    return [tuple(numels[i] for i in b) for b in buckets]


@functools.lru_cache(maxsize=1024)
def _split_runs(runs: tuple[tuple[int, float], ...], sizes: tuple[int, ...]) -> tuple[float | None, ...]:
    """Per-parameter values of a reduced bucket, when each parameter's slice is uniform.
    (Kept: every rank splits the same reduced bucket every iteration.)"""
    out: list[float | None] = []
    k, left = 0, runs[0][0] if runs else 0
    for n in sizes:
        vals = set()
        need = n
        while need > 0 and k < len(runs):
            take = min(need, left)
            vals.add(runs[k][1])
            need -= take
            left -= take
            if left == 0:
                k += 1
                left = runs[k][0] if k < len(runs) else 0
        out.append(vals.pop() if len(vals) == 1 else None)
    return tuple(out)


class _DDPJoinHook(JoinHook):
    def __init__(self, ddp: DDPModel):
        self.ddp = ddp

    def main_hook(self) -> Generator[Any, Any, None]:
        ddp = self.ddp
        if ddp.rebuilt_params:  # (as in `_pre_forward`)
            yield from ddp._rebuild_buckets("ddp.join_hook.rebuild_buckets")
        # _check_and_sync_module_buffers
        if ddp._check_sync_bufs_pre_fwd():
            root = yield from ddp._find_common_rank(ddp.group_rank, False, "ddp.join_hook.find_common_rank")
            yield from ddp._broadcast_coalesced(ddp.buffer_numels, root, "ddp.join_hook.sync_buffers")
        work = ddp._check_global_requires_backward_grad_sync(True, origin="ddp.join_hook.requires_grad_sync")
        res = yield from work.wait()
        should_sync_backwards = (res.item() or 0) != 0
        ddp.require_forward_param_sync = should_sync_backwards
        if not should_sync_backwards:
            return
        # _match_all_reduce_for_bwd_pass: zeros per bucket, all issued, then all waited
        yield from wait_all([
            ddp._issue("all_reduce", Payload.full(sum(ddp.numels[i] for i in b), ddp.dtype, 0.0),
                       origin="ddp.join_hook.bucket_allreduce", async_op=True)
            for b in ddp.buckets
        ])
        if ddp.find_unused_parameters:
            # _match_unused_params_allreduce: the local used map (zeros on a joined rank); not waited
            ddp._issue("all_reduce", Payload.full(len(ddp.numels), "int32", 0),
                       origin="ddp.join_hook.unused_map_allreduce", async_op=True)
        ddp._push_all_rebuilt_params()

    def post_hook(self, is_last_joiner: bool) -> Generator[Any, Any, None]:
        yield from self.ddp._sync_final_model(is_last_joiner)

