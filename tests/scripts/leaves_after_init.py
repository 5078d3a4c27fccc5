"""Rank 0 leaves right after `init_process_group` (it returns: exit status 0, so torchrun's
agent does not act); the other ranks go on to a barrier, which fails with rank 0's closure.
Gloo's init returns once a rank's own side of each pair is connected: on a loaded host a peer
can still be connecting its side when rank 0's process has ended, and fails in init instead
("Gloo connectFullMesh failed with ... Connection closed by peer"): the connect race that
shows in init (`simdist.races.ConnectRace`; the simulated report notes it,
docs/script-backend.md, "Races of the real run")."""

import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
if rank != 0:
    dist.barrier()
print(f"[{rank}] done", flush=True)
