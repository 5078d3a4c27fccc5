"""The c10d Flight Recorder's dump format and environment, as torch writes and reads them.

Every side of simdist that meets a Flight Recorder (FR) dump takes its names from here: the
real backend's recorder (`real_backend.record`), the script backend's Gloo mode, the
reader of users' dumps (`simdist.flightrec.ingest`) and the writer of dumps for torch's
own analyzer (`simdist.flightrec.export`).

What torch does (torch 2.13, read from its source and from its dumps):

* FR is on when ``TORCH_FR_BUFFER_SIZE`` > 0 before `init_process_group` (older releases:
  ``TORCH_NCCL_TRACE_BUFFER_SIZE``). Each entry is one operation enqueued on a backend:
  ``profiling_name`` (``gloo:all_reduce``, ``nccl:send 0->1``), the per-group
  ``collective_seq_id`` (``p2p_seq_id`` for point-to-point), ``process_group`` = (name,
  description), input/output sizes and dtypes, ``time_created_ns``, ``state``, ``retired``
  and, in the pickle form only, the Python ``frames`` of the call.
* The dump is a dict: ``version`` ("2.10" in torch 2.13; the minor number grows with each
  added field), ``pg_config`` (name -> {name, desc, ranks}), ``pg_status``, ``entries``.
  ``_dump_fr_trace()`` gives the pickle form, ``_dump_fr_trace_json()`` the JSON form.
* A dump goes to ``${TORCH_FR_DUMP_TEMP_FILE}<global rank>`` (torch's `DebugInfoWriter`;
  the prefix defaults to ``~/.cache/torch/comm_lib_trace_rank_``): ProcessGroupNCCL's
  watchdog writes it on a timeout. The control plane answers on demand over
  ``TORCH_WORKER_SERVER_SOCKET`` (handler ``fr_trace_json``), and torchelastic's
  ``@record`` writes a rank's uncaught exception to ``TORCHELASTIC_ERROR_FILE``.
* Gloo's recorder: ``state`` stays "scheduled", ``retired`` turns True when the work ends
  (also when it failed), send/recv are not recorded, and ``pg_config`` names no ranks.
"""

from __future__ import annotations

import math
from pathlib import Path

from simdist.vocab import FR_DTYPES

# --------------------------------------------------------------------------- environment
FR_ENV = "TORCH_FR_BUFFER_SIZE"
FR_BUFFER_SIZE = "20000"
FR_DUMP_ENV = "TORCH_FR_DUMP_TEMP_FILE"
LEGACY_DUMP_ENV = "TORCH_NCCL_DEBUG_INFO_TEMP_FILE"  # still read by torch's DebugInfoWriter
DEFAULT_DUMP_PREFIX = "comm_lib_trace_rank_"  # torch's default file name (in ~/.cache/torch)
ERROR_FILE_ENV = "TORCHELASTIC_ERROR_FILE"
ERROR_FILE_NAME = "error.json"  # torchelastic: <log dir>/attempt_<n>/<local rank>/error.json
WORKER_SOCKET_ENV = "TORCH_WORKER_SERVER_SOCKET"
ON_DEMAND_HANDLER = "fr_trace_json"  # POST /handler/fr_trace_json on the worker's socket


def dump_path(prefix: str, rank: int) -> str:
    """Where torch's DebugInfoWriter puts rank `rank`'s dump: the prefix, then the rank."""
    return f"{prefix}{rank}"


# --------------------------------------------------------------------------- versions
# What torch 2.13 writes, and what `export` writes so torch's analyzer takes the v2.7+ path.
FORMAT_VERSION = "2.10"
DEFAULT_PG_DESC = "default_pg"  # the description torch gives the default process group
UNDEFINED_DESC = "undefined"  # a new_group without group_desc


def parse_version(version: object) -> tuple[int, int] | None:
    """(major, minor) of a dump's ``version`` ("2.10" -> (2, 10)), None when it is not one."""
    parts = str(version).split(".")
    if len(parts) != 2 or not all(p.isdigit() for p in parts):
        return None
    return int(parts[0]), int(parts[1])


# --------------------------------------------------------------------------- dtypes
# Ops without a tensor payload are recorded with numel 0 and this dtype.
NO_DTYPE = "none"


def fr_numel(sizes: list[list[int]]) -> int:
    """Element count of an entry's inputs, all of them (a list all_to_all records one size
    per tensor; the simulator counts what a rank sends in all)."""
    return sum(math.prod(s) for s in sizes)


def fr_dtype(dtypes: list[str]) -> str:
    """The simulator's dtype name of an entry's first input."""
    return FR_DTYPES.get(dtypes[0], dtypes[0].lower()) if dtypes else NO_DTYPE


# --------------------------------------------------------------------------- op names
# The names torch has recorded for each op (opTypeToString of older releases, the function
# names of newer ones, NCCL's coalesced and out-of-place variants), as simdist's op names.
_OP_NAMES = {
    "allreduce": "all_reduce", "allreduce_coalesced": "all_reduce", "all_reduce_barrier": "barrier",
    "allgather": "all_gather", "_allgather_base": "all_gather", "_all_gather_base": "all_gather",
    "allgather_coalesced": "all_gather", "ALLGATHER_coalesced": "all_gather", "all_gather_single": "all_gather",
    "all_gather_into_tensor_coalesced": "all_gather", "all_gather_v": "all_gather",
    "_reduce_scatter_base": "reduce_scatter", "reduce_scatter_single": "reduce_scatter",
    "REDUCE_SCATTER_coalesced": "reduce_scatter", "reduce_scatter_tensor_coalesced": "reduce_scatter",
    "reduce_scatter_v": "reduce_scatter",
    "alltoall": "all_to_all", "alltoall_base": "all_to_all", "all_to_all_single": "all_to_all",
    "all_to_all_v_single": "all_to_all",
    "_broadcast_oop": "broadcast", "_reduce_oop": "reduce",
}
COALESCED = "coalesced"  # NCCL's end-of-group marker entry (same seq id as the group's ops)


def fr_backend(profiling_name: str) -> str:
    """The backend that recorded an entry (``gloo:all_reduce`` -> ``gloo``)."""
    return profiling_name.split(":", 1)[0] if ":" in profiling_name else ""


def fr_op_name(profiling_name: str) -> str:
    """The simulator's op name of an entry (`gloo:allreduce` -> `all_reduce`); a name simdist
    does not know comes back as recorded (``coalesced`` and ``send 0->1`` without the peers)."""
    op = profiling_name.split(":", 1)[-1].split(" ", 1)[0]
    return _OP_NAMES.get(op, op)


def fr_p2p_ranks(profiling_name: str) -> tuple[int, int] | None:
    """(source, destination) group ranks of NCCL's ``send 0->1`` / ``recv 1<-0`` names."""
    tail = profiling_name.split(" ", 1)[1] if " " in profiling_name else ""
    try:
        if "->" in tail:
            src, dst = tail.split("->")
            return int(src), int(dst)
        if "<-" in tail:
            dst, src = tail.split("<-")
            return int(src), int(dst)
    except ValueError:
        return None
    return None


def fr_env(folder: Path, rank: int, on_demand: bool = False) -> dict[str, str]:
    """What a production launcher sets for rank `rank` so that torch leaves its records in
    `folder`: the Flight Recorder dump prefix (the rank is appended by the writer), the
    torchelastic error file in its per-rank layout, and the control-plane socket.

    The paths are absolute: the ranks run in another working directory than the caller's,
    where a relative `--fr-dumps dumps/` would name another (usually missing) folder."""
    folder = Path(folder).absolute()
    (folder / str(rank)).mkdir(parents=True, exist_ok=True)
    env = {FR_DUMP_ENV: str(folder / DEFAULT_DUMP_PREFIX), ERROR_FILE_ENV: str(folder / str(rank) / ERROR_FILE_NAME)}
    if on_demand:
        env[WORKER_SOCKET_ENV] = str(folder / f"rank{rank}.sock")
    for stale in (dump_path(env[FR_DUMP_ENV], rank), env[ERROR_FILE_ENV], env.get(WORKER_SOCKET_ENV)):
        if stale:  # a record left by an earlier run would be read as this one's
            Path(stale).unlink(missing_ok=True)
    return env
