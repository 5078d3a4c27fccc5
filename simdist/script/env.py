"""What both sides of a script run agree on: the environment through which the launcher
reaches every process, and the names of process groups.

Children inherit the environment, including those the script starts itself
(`torch.multiprocessing.spawn`, `multiprocessing.Process`), so this is how the rank-side
layer finds the coordinator without the user's code passing anything along.
"""

from __future__ import annotations

import json
import os
import re
from pathlib import Path

SOCKET = "SIMDIST_SCRIPT_SOCKET"  # the coordinator's Unix socket; its presence switches the layer on
RUN_ID = "SIMDIST_SCRIPT_RUN"  # tags every process of one run (cleanup finds them by it)
# the pid of the process started for a torchrun-style rank, set by that process (`rank.exits.claim`)
# and inherited by its children: only that process speaks for its rank
RANK_PID = "SIMDIST_SCRIPT_RANK_PID"
GPUS = "SIMDIST_SCRIPT_GPUS"  # how many CUDA devices torch.cuda reports; 0: a CPU-only node (`gpus`)
MODE = "SIMDIST_SCRIPT_MODE"  # "sim": simulated ranks; "gloo": real Gloo process groups (passthrough)
SIM, GLOO = "sim", "gloo"
STORE = "SIMDIST_SCRIPT_STORE"  # gloo mode: host:port of the launcher's loopback rendezvous store
# gloo mode: host:port of the launcher's second store, where each generation k > 1 of a torchrun-style
# run meets its peers' Gloo addresses apart from the keys the script sees (`rank.genkeys`)
GEN_STORE = "SIMDIST_SCRIPT_GEN_STORE"
HOST_PORT = "SIMDIST_SCRIPT_HOST_PORT"  # gloo mode: 127.0.0.1:port, where rank 0 hosts an env:// or tcp:// store
PORT_MAP = "SIMDIST_SCRIPT_PORT_MAP"  # torchrun-style: "29501:41234,...", MASTER_PORT + k -> the run's own port (`rank.ownstore`)
# A barrier carries no tensor; both sides' traces give it this dtype (the engine needs one; real
# Gloo's Flight Recorder records none), as a scenario's barrier keeps its step's dtype.
BARRIER_DTYPE = "float32"
# what a simulated rank tells before it dies by SIGSEGV in DDP's constructor under
# TORCH_DISTRIBUTED_DEBUG=DETAIL (`rank.pgwrapper`); the report says why (`script.detail`)
SEGV_DDP_DETAIL = "segv_ddp_detail"
BATCHES = "SIMDIST_SCRIPT_BATCHES"  # per-rank DataLoader caps, "5,6" or "5" (rank.batches)

# How a rank says it met an operation the simulated backend cannot model (`rank.pg`); the
# simdist side finds it in a rank's error, wherever torch wrapped the exception.
UNSUPPORTED = "simdist: {} is not supported by the simulated backend"
_UNSUPPORTED = re.compile(re.escape(UNSUPPORTED).replace(re.escape("{}"), "(.+?)"))

BOOTSTRAP_DIR = Path(__file__).resolve().parent / "rank" / "bootstrap"


def active() -> bool:
    return bool(os.environ.get(SOCKET))


def mode() -> str:
    return os.environ.get(MODE, SIM)


def gpus() -> int:
    """How many GPUs this process's node has (`--gpus-per-node`): N simulated ones, or 0 for a
    CPU-only node, where the rank layer installs no GPU shim and the script sees this host's
    torch as installed (a CPU build: no CUDA at all)."""
    return int(os.environ.get(GPUS, "8"))


# What torch raises where a script's GPU path reaches a CUDA-only feature the simulated GPUs
# (`rank.devices`, `rank.gpu_shims`) do not provide (DTensor's random ops on a "cuda" mesh,
# FSDP2's meta-device initialisation with reset_parameters): on a GPU the program runs, so
# the failure is a gap of the simulator, not the program's error. "Cannot access accelerator
# device": `torch.device(index)`, which a CPU build cannot resolve and a GPU one makes cuda:index
# (a ShardedTensor with no local shard under a non-Gloo backend: FSDP's sharded state dict).
# Once CUDA counts as initialised (`rank.cuda_init`), torch's `_lazy_init` passes and a call
# reaches the CUDA binding a CPU build lacks (`torch._C._cuda_setMemoryFraction`) or CUDA's
# own allocation ("Cannot initialize CUDA without ATen_cuda library").
_NO_CUDA = re.compile(r"Torch not compiled with CUDA enabled|PyTorch is not linked with support for cuda devices"
                      r"|Cannot get CUDA generator without ATen_cuda library"
                      r"|Cannot access accelerator device when none is available"
                      r"|Cannot initialize CUDA without ATen_cuda library"
                      r"|module 'torch\._C' has no attribute '_cuda_\w+'")


# A process that calls an API the simulator cannot model outside any group (`init_rpc`; it may
# never become a rank, so its error is no rank's) writes the error beside the coordinator's
# socket, in the run's own folder, before it raises (`rank.patches`); `refusal` reads them.
_REFUSED = "refused-{}.json"


def refuse(rank: int, error: str) -> None:
    path = os.path.join(os.path.dirname(os.environ[SOCKET]), _REFUSED.format(os.getpid()))
    Path(path + ".tmp").write_text(json.dumps({"rank": rank, "error": error}))
    os.replace(path + ".tmp", path)  # whole or absent, even if the process is killed meanwhile


# Every path a process of the run wrote, created, renamed or deleted (`rank.writes`), one a
# line, in a file of its own beside the coordinator's socket: what `compare` sets aside
# between its sides is what the first side wrote, never another process's files.
WRITES = "writes-{}.txt"


def writes_file() -> str | None:
    """This process's list of the paths it wrote (`WRITES`); None outside a run's process (a
    fork server's own, whose socket is a placeholder, "-": `script.zygote`)."""
    folder = os.path.dirname(os.environ.get(SOCKET, ""))
    return os.path.join(folder, WRITES.format(os.getpid())) if folder else None


def written(folder: str) -> frozenset[str]:
    """The absolute paths the run's processes wrote (`WRITES`), read once they have all ended."""
    out: set[str] = set()
    for p in Path(folder).glob(WRITES.format("*")):
        out.update(line for line in p.read_text(errors="surrogateescape").splitlines() if line)
    return frozenset(out)


def refusal(folder: str) -> str | None:
    """The lowest rank's refusal in the run's folder (each refusing process wrote one, in any
    order: the first to write must not decide, or two runs would differ)."""
    found = [json.loads(p.read_text()) for p in Path(folder).glob(_REFUSED.format("*"))]
    return min(((f["rank"], f["error"]) for f in found), default=(0, None))[1]


def unsupported_in(message: str, gpus: bool = True) -> str | None:
    """The operation named in a rank's error, when it is the backend's "cannot model" error
    or a CUDA-only path the simulated GPUs lack (`gpus` False, a CPU-only node: CUDA's absence
    is the machine's, so its error is the program's own, as on this host)."""
    m = _UNSUPPORTED.search(message)
    if m:
        return m.group(1)
    c = _NO_CUDA.search(message) if gpus else None
    return f"a CUDA-only operation on the simulated GPUs ({c.group(0)})" if c else None


def group_name(torch_name: str, default: bool, generation: int = 1) -> str:
    """The report's name of a process group: WORLD, or pg<torch's group name>. Torch names a
    group by the rank's creation count, or (use_local_synchronization) by a hash of its ranks
    and how many groups the rank has: the same on every member only where they made their
    groups alike, as Gloo's rendezvous by that name needs (`Coordinator._group`). In a later
    generation of ranks (`simdist.script.generations`) the name is prefixed `gen<k>/`: torch
    names the groups of each generation alike (destroying the default group resets its
    count), so the prefix keeps a group's sequence numbers apart from the earlier
    generations' in every (group, seq) key of both sides' reports, and `compare` matches
    generation to generation."""
    name = "WORLD" if default else (f"pg{torch_name}" if torch_name.isdigit() else f"pg{torch_name[:10]}")
    return name if generation <= 1 else f"{GENERATION_PREFIX.format(generation)}{name}"


GENERATION_PREFIX = "gen{}/"
_GENERATION = re.compile(r"^gen(\d+)/")


def generation_of(group: str) -> int:
    """The generation a report's group name belongs to (1 when it has no prefix)."""
    m = _GENERATION.match(group)
    return int(m.group(1)) if m else 1


def parse_batches(text: str) -> list[int]:
    """The `--batches` caps: '5,6' -> [5, 6] (one per rank); '5' -> [5] (every rank).
    Raises ValueError naming the problem."""
    parts = [p.strip() for p in str(text).split(",")]
    if not parts or any(not p.isdigit() for p in parts):
        raise ValueError(f"expected batches per rank as non-negative integers separated by commas "
                         f"(e.g. 5,6) or one for every rank, got {text!r}")
    return [int(p) for p in parts]


def format_batches(caps: list[int]) -> str:
    return ",".join(str(c) for c in caps)

