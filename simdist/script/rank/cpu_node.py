"""A CPU-only node (`--gpus-per-node 0`): what this host's torch refuses that the simulated
backend, or the Gloo that `compare`'s real side puts in its place, would otherwise accept.

On such a node the rank layer installs no GPU shim (`rank.boot`), so the script sees torch as
installed; but every group is made on `simdist` (or Gloo) whatever backend the script names
(`rank.patches`), and a CPU build of torch has no NCCL: `init_process_group("nccl")` (or
`"cpu:gloo,cuda:nccl"`, or `new_group(backend="nccl")`) raises "Distributed package doesn't
have NCCL built in" in `_new_process_group_helper`, after the rendezvous (plain torchrun of such
a script on this host: every rank raises it at its init). The check runs where torch's would:
after the coordinator's rendezvous reply, before the group is built.
"""

from __future__ import annotations

from typing import Any

from simdist.script import env


def check_backend(requested: Any) -> None:
    """Raise what torch's group helper raises for a backend this node's torch lacks (NCCL on a
    CPU build); nothing on a node with simulated GPUs, where NCCL stands modelled."""
    if requested is None or env.gpus() > 0:
        return
    import torch.distributed.distributed_c10d as c10d

    try:
        wanted = c10d.BackendConfig(c10d.Backend(str(requested))).get_device_backend_map().values()
    except (ValueError, RuntimeError):  # a name torch itself refuses: left to its own check
        return
    if c10d.Backend.NCCL in wanted and not c10d.is_nccl_available():
        raise RuntimeError("Distributed package doesn't have NCCL built in")
