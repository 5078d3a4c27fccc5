"""The names simdist's simulator, real backend, checker and cost model share, defined once.

Every other module imports these instead of spelling its own set: which ops are rooted
or reducing, what each backend supports, dtype sizes, finding kinds, origin labels, the
model joinables (the `[[joinables]]` kinds are in `simdist.torchmodels.registry`), run
statuses. A name that is not declared here is a bug (a test checks
that the simulator and the real recorder emit only declared origins and finding kinds).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Literal

# --------------------------------------------------------------------------- process groups
WORLD = "WORLD"

# --------------------------------------------------------------------------- ops


@dataclass(frozen=True)
class OpInfo:
    """What one torch.distributed operation is, as far as matching and costing care.

    `rooted`: has a root rank (broadcast src, reduce/gather dst, scatter src), which must
    agree across ranks. `reducing`: takes a ReduceOp. `p2p`: point-to-point (paired by
    peer and tag, not by the group's collective sequence). `backends`: where torch 2.13
    implements it for CPU (gloo) or CUDA (nccl) tensors. `torch_name`: the torch.distributed
    function a scenario step issues it with, where that is named otherwise (torch's warnings
    name the function, e.g. "Running all_to_all_single on global rank ...").
    """

    name: str
    rooted: bool = False
    reducing: bool = False
    p2p: bool = False
    backends: frozenset[str] = frozenset({"gloo", "nccl"})
    torch_name: str = ""

    @property
    def function(self) -> str:
        """The torch.distributed function that issues this op from a scenario step."""
        return self.torch_name or self.name


_OPS = (
    OpInfo("all_reduce", reducing=True),
    OpInfo("broadcast", rooted=True),
    OpInfo("all_gather"),
    OpInfo("reduce_scatter", reducing=True, torch_name="reduce_scatter_single"),
    OpInfo("reduce", rooted=True, reducing=True),
    OpInfo("gather", rooted=True),
    OpInfo("scatter", rooted=True),
    OpInfo("all_to_all", torch_name="all_to_all_single"),
    OpInfo("barrier"),
    OpInfo("send", p2p=True),
    OpInfo("recv", p2p=True),
)
OPS: dict[str, OpInfo] = {o.name: o for o in _OPS}
COLLECTIVE_OPS: tuple[str, ...] = tuple(o.name for o in _OPS if not o.p2p)
P2P_OPS: frozenset[str] = frozenset(o.name for o in _OPS if o.p2p)
ROOTED_OPS: frozenset[str] = frozenset(o.name for o in _OPS if o.rooted)
REDUCING_OPS: frozenset[str] = frozenset(o.name for o in _OPS if o.reducing)

CollectiveOp = Literal[
    "all_reduce", "broadcast", "all_gather", "reduce_scatter", "reduce", "gather", "scatter", "all_to_all", "barrier"
]
ReduceOp = Literal["sum", "avg", "product", "min", "max", "band", "bor", "bxor"]
REDUCE_OPS: tuple[str, ...] = ("sum", "avg", "product", "min", "max", "band", "bor", "bxor")
BITWISE_REDUCE_OPS: frozenset[str] = frozenset({"band", "bor", "bxor"})
# NCCL's pre-multiplied sum (`dist._make_nccl_premul_sum`, FSDP's gradient division): a script
# may hand it to Gloo, which fails the work at wait() without the wire (torch 2.13, measured)
PREMUL_SUM = "premul_sum"
# the reduce ops Gloo may refuse for a rank alone, before the wire (`engine.results.gloo_local_error`)
GLOO_LOCAL_REDUCE_OPS: frozenset[str] = BITWISE_REDUCE_OPS | {PREMUL_SUM}
# the ops whose Gloo algorithm returns at once for a tensor of zero elements: the rank's call
# completes without the wire, whether or not its peers call it (measured, torch 2.13, 2 and 3
# ranks; broadcast, gather, scatter and all_to_all wait for their peers even then). Gloo's
# reduce_scatter forms and all_reduce_coalesced are all_reduces, so theirs too.
GLOO_EMPTY_IS_LOCAL: frozenset[str] = frozenset({"all_reduce", "reduce", "all_gather"})


def gloo_empty_is_local(op: str, numel: int) -> bool:
    """Whether Gloo completes one rank's call of `op` with `numel` elements without the wire
    (`GLOO_EMPTY_IS_LOCAL`): the one rule the engine and the script backend both apply."""
    return numel == 0 and op in GLOO_EMPTY_IS_LOCAL


def root_of(op: str, root: int | None) -> int | None:
    """The root as it matters for `op` (None for ops that have none)."""
    return root if op in ROOTED_OPS else None


def reduce_op_of(op: str, reduce_op: str | None) -> str | None:
    """The reduce op as it matters for `op` (None for ops that take none; sum by default)."""
    return (reduce_op or "sum") if op in REDUCING_OPS else None


# --------------------------------------------------------------------------- dtypes
# Element size in bytes of the torch dtypes scenarios may name (torch.<name>).
DTYPE_BYTES: dict[str, int] = {
    "float32": 4,
    "float64": 8,
    "float16": 2,
    "bfloat16": 2,
    "int64": 8,
    "int32": 4,
    "int16": 2,
    "int8": 1,
    "uint8": 1,
    "bool": 1,
}
# Further names the Gloo rules and recorders meet (complex views, torch's short aliases).
# torch's own scalar-type names (c10 ScalarType: what Flight Recorder dumps and Gloo's error
# messages print) against ours: the engine words errors with them, flightrec reads and writes them.
FR_DTYPES: dict[str, str] = {
    "Float": "float32",
    "Double": "float64",
    "Half": "float16",
    "BFloat16": "bfloat16",
    "Long": "int64",
    "Int": "int32",
    "Short": "int16",
    "Char": "int8",
    "Byte": "uint8",
    "Bool": "bool",
}
TORCH_DTYPE_NAMES: dict[str, str] = {v: k for k, v in FR_DTYPES.items()}  # float32 -> Float (what export writes)

DTYPE_ALIASES: dict[str, str] = {
    "float": "float32",
    "double": "float64",
    "half": "float16",
    "long": "int64",
    "int": "int32",
    "short": "int16",
}
EXTRA_DTYPE_BYTES: dict[str, int] = {"complex64": 8, "complex128": 16}
INT_DTYPES: frozenset[str] = frozenset({"int64", "int32", "int16", "int8", "uint8"})
FLOAT_DTYPES: frozenset[str] = frozenset({"float32", "float64", "float16", "bfloat16"})
# Dtypes Gloo has no collective kernel for (ProcessGroupGloo's GENERATE_ALL_TYPES: float,
# double, half, bfloat16, int8, uint8, int32, int64, bool): every collective but barrier
# fails with "Invalid scalar type" (send/recv copy bytes and work). Measured on torch 2.13.
GLOO_NO_KERNEL_DTYPES: frozenset[str] = frozenset({"int16"})


def gloo_refusal(op: str, reduce_op: str | None, dtype: str) -> str | None:
    """The error ProcessGroupGloo raises on its worker thread for one rank's call of `op`
    before anything reaches the wire, None if none (`engine.results.gloo_local_error`): the
    reduce op first (PREMUL_SUM, NCCL's alone; a bitwise op on a float), then a dtype with no
    kernel. It is picked before Gloo's algorithm sees the tensor, so an empty call that
    `gloo_empty_is_local` would complete fails the same way (measured, torch 2.13)."""
    if reduce_op == PREMUL_SUM and op in REDUCING_OPS:
        return "Cannot use ReduceOp.PREMUL_SUM with Gloo"
    if reduce_op in BITWISE_REDUCE_OPS and op in REDUCING_OPS and dtype in FLOAT_DTYPES:
        return f"Cannot use ReduceOp.{reduce_op.upper()} with non-integral dtype"
    if dtype in GLOO_NO_KERNEL_DTYPES and op not in P2P_OPS and op != "barrier":
        return "Invalid scalar type"
    return None
Dtype = Literal["float32", "float64", "float16", "bfloat16", "int64", "int32", "int16", "int8", "uint8", "bool"]


# The values `torch.full(size, value, dtype=...)` takes (c10's overflow check): beyond them
# torch raises "value cannot be converted to type ... without overflow", so a scenario's
# `value` must lie within its dtype's range. A Python int may also wrap into uint8 (down to
# -255); a float may not. (float16 is checked against its largest finite value, 65504; torch
# also takes values that round down to it.)
DTYPE_RANGE: dict[str, tuple[float, float]] = {
    "float32": (-3.4028234663852886e38, 3.4028234663852886e38),
    "float64": (-1.7976931348623157e308, 1.7976931348623157e308),
    "float16": (-65504.0, 65504.0),
    "bfloat16": (-3.3895313892515355e38, 3.3895313892515355e38),
    "int64": (-(1 << 63), (1 << 63) - 1),
    "int32": (-(1 << 31), (1 << 31) - 1),
    "int16": (-(1 << 15), (1 << 15) - 1),
    "int8": (-128, 127),
    "uint8": (0, 255),
    "bool": (-float("inf"), float("inf")),
}


def fill_fits(value: float | int, dtype: str) -> bool:
    """Whether `torch.full(..., value, dtype=dtype)` takes `value` (see DTYPE_RANGE)."""
    lo, hi = DTYPE_RANGE[dtype]
    if dtype == "uint8" and isinstance(value, int):
        lo = -hi
    return lo <= value <= hi


def dtype_bytes(dtype: str) -> int:
    """Element size of a dtype name, aliases and complex types included (KeyError if unknown)."""
    name = DTYPE_ALIASES.get(dtype, dtype)
    return DTYPE_BYTES[name] if name in DTYPE_BYTES else EXTRA_DTYPE_BYTES[name]


# --------------------------------------------------------------------------- topologies
# The preset topologies (`simdist.network.topology.preset_network`) and, for those with a
# fixed number of GPUs, how many ranks fit.
PRESETS: tuple[str, ...] = ("loopback", "switch8", "two_nodes", "ring")
PRESET_MAX_WORLD: dict[str, int] = {"switch8": 8}

# --------------------------------------------------------------------------- run results
# Observed values (`observe = ...`) carry elements for results of at most this many; larger
# ones are reported as null, on both sides (the simulator carries explicit values that far).
OBSERVED_MAX_NUMEL = 64
Status = Literal["completed", "error", "hang", "aborted"]
Outcome = Literal["completed", "hang", "error"]
STATUSES: tuple[str, ...] = ("completed", "error", "hang", "aborted")
OUTCOMES: tuple[str, ...] = ("completed", "hang", "error")
PHASES: tuple[str, ...] = ("init", "loop", "join_exit", "after")
# How both sides' reports begin the exit of a rank torchrun's agent ended (`simdist.script.agent`).
AGENT_TERMINATED = "terminated by torchrun's agent (SIGTERM)"
# RankError.category: a stable class of failure shared by both sides.
ERROR_CATEGORIES: tuple[str, ...] = (
    "join_early_termination", "peer_lost", "gloo_abort", "timeout", "model", "killed", "other",
)

# --------------------------------------------------------------------------- findings
# The first field on which ranks' calls at one sequence number disagree (the engine's).
MISMATCH_KINDS: tuple[str, ...] = (
    "op_mismatch", "size_mismatch", "dtype_mismatch", "reduce_op_mismatch", "root_mismatch", "p2p_size_mismatch",
)
# What only the finished run shows (the checker's).
CHECKER_KINDS: tuple[str, ...] = ("hang", "p2p_unmatched", "deadlock", "peer_exited", "rank_error")
FINDING_KINDS: tuple[str, ...] = MISMATCH_KINDS + CHECKER_KINDS

# --------------------------------------------------------------------------- joinables
# The scenario's model and optimizer when named in [join].joinables; [[joinables]] kinds are
# named by the joinable registry (simdist.torchmodels.registry), which may not reuse these.
MODEL_JOINABLES: tuple[str, ...] = ("ddp", "zero")
# The `[join].kwargs` that Join hands every joinable's join hook and that the models read,
# with their types (a count is an int >= 0); other keys are passed on and ignored, as torch does.
JOIN_KWARGS: dict[str, type] = {
    "num_allreduces": int,  # AllReducer
    "sync_max_count": bool,  # Counter
    "run_post_hooks": bool,  # AllReducer
    "divide_by_initial_world_size": bool,  # DDP
}
# What AllReducer raises when no rank was the last joiner (torch's test: `assert common_rank >= 0`).
NO_COMMON_RANK = "no last joiner: common rank is -1"

# What Gloo's error starts with when connecting a group's full mesh fails (at init or
# new_group): the simulator's refused connect and the races of real runs both read it.
FULL_MESH = "Gloo connectFullMesh failed with"

# --------------------------------------------------------------------------- origins
# Every origin label either side may emit for a collective that torch components issue.
# Labels of the user's own calls belong to the `user.` family: `user.<step name>` or
# `user.<section>[<index>]` for scenario steps (see `is_declared_origin`).
USER_ORIGIN_PREFIX = "user."
ORIGINS: dict[str, str] = {
    "ddp.init.verify_params": "DDP constructor: _verify_param_shape_across_processes (all_gather + broadcast)",
    "ddp.init.sync_module_states": "DDP constructor: _sync_module_states broadcast from rank 0",
    "join.notify_join_context.heartbeat": "Join.notify_join_context: async all-reduce of ones (first joinable only)",
    "join.notify_join_context.throw_check": "Join.notify_join_context: all-reduce of zeros (throw_on_early_termination)",
    "join.exit.count_nonjoined": "Join.__exit__: all-reduce of zeros counting non-joined ranks",
    "join.exit.notify_terminate": "Join.__exit__: all-reduce of ones before raising (throw_on_early_termination)",
    "ddp.pre_forward.rebuild_buckets": "DDP _pre_forward: reducer._rebuild_buckets broadcasts (2nd iteration)",
    "ddp.pre_forward.find_common_rank": "DDP _pre_forward: buffer sync authoritative rank (all-reduce MAX)",
    "ddp.pre_forward.sync_buffers": "DDP _pre_forward: buffer broadcast",
    "ddp.pre_forward.requires_grad_sync": "DDP _pre_forward: backward-sync flag all-reduce (Join enabled)",
    "ddp.backward.bucket_allreduce": "DDP reducer: gradient bucket all-reduce",
    "ddp.backward.unused_map_allreduce": "DDP reducer: local-used map all-reduce (find_unused_parameters)",
    "ddp.join_hook.rebuild_buckets": "DDP join hook: reducer._rebuild_buckets broadcasts",
    "ddp.join_hook.find_common_rank": "DDP join hook: buffer sync authoritative rank",
    "ddp.join_hook.sync_buffers": "DDP join hook: buffer broadcast",
    "ddp.join_hook.requires_grad_sync": "DDP join hook: backward-sync flag all-reduce (zeros)",
    "ddp.join_hook.bucket_allreduce": "DDP join hook: shadow gradient bucket all-reduce (zeros)",
    "ddp.join_hook.unused_map_allreduce": "DDP join hook: shadow local-used map all-reduce",
    "ddp.post_hook.find_common_rank": "DDP join post hook: last joiner (all-reduce MAX)",
    "ddp.post_hook.broadcast_final_model": "DDP join post hook: final model broadcast from the last joiner",
    "zero.step.broadcast_shard": "ZeroRedundancyOptimizer.step: broadcast of each rank's parameter shard",
    "zero.join_hook.broadcast_shard": "ZeRO join hook: step() shadowing the shard broadcasts",
    "counter.call.allreduce": "Counter.__call__: all-reduce of ones",
    "counter.main_hook.allreduce": "Counter join hook: shadow all-reduce of zeros",
    "counter.post_hook.find_common_rank": "Counter post hook: last joiner (all-reduce MAX)",
    "counter.post_hook.broadcast_max_count": "Counter post hook: broadcast of max_count",
    "allreducer.call.allreduce": "AllReducer.__call__: all-reduce of ones",
    "allreducer.main_hook.allreduce": "AllReducer join hook: shadow all-reduce of zeros",
    "allreducer.post_hook.find_common_rank": "AllReducer post hook (run_post_hooks): last joiner (all-reduce MAX)",
    "allreducer.post_hook.broadcast": "AllReducer post hook (run_post_hooks): broadcast of post_hook_tensor",
}


def is_declared_origin(origin: str) -> bool:
    """Whether `origin` is a label of `ORIGINS` or of the `user.` family."""
    return origin in ORIGINS or (origin.startswith(USER_ORIGIN_PREFIX) and len(origin) > len(USER_ORIGIN_PREFIX))
