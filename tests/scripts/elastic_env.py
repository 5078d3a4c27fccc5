"""What a torchrun-launched script reads of its launcher: the elastic environment
(LOCAL_WORLD_SIZE, GROUP_RANK, ROLE_RANK, TORCHELASTIC_RUN_ID, restart count),
dist.is_torchelastic_launched(), dist.get_backend() of the world and of a subgroup, and
init_process_group(device_id=...) with an int local rank on a GPU-style script; nodes are
derived from LOCAL_WORLD_SIZE the way multi-node scripts do."""

import logging
import os

import torch
import torch.distributed as dist

logger = logging.getLogger("train")


def env_int(name, default=None):
    v = os.environ.get(name)
    return int(v) if v is not None else default


def main():
    local_rank = env_int("LOCAL_RANK", 0)
    local_world = env_int("LOCAL_WORLD_SIZE", 1)
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend, device_id=local_rank if torch.cuda.is_available() else None)
    rank, world = dist.get_rank(), dist.get_world_size()
    logging.basicConfig(level=logging.INFO if rank == 0 else logging.WARNING,
                        format=f"[%(levelname)s rank{rank}] %(message)s")
    node = rank // local_world
    nnodes = world // local_world
    logger.info("elastic launched %s, run id set %s, restarts %s, nodes %d",
                dist.is_torchelastic_launched(), bool(os.environ.get("TORCHELASTIC_RUN_ID")),
                os.environ.get("TORCHELASTIC_RESTART_COUNT"), nnodes)
    print(f"[rank{rank}] local {local_rank}/{local_world} group_rank {os.environ.get('GROUP_RANK')} "
          f"role_rank {os.environ.get('ROLE_RANK')} node {node} backend {dist.get_backend()}", flush=True)
    # a group of this node's ranks and one of the same local rank across nodes
    intra = dist.new_group(list(range(node * local_world, (node + 1) * local_world)))
    print(f"[rank{rank}] intra backend {dist.get_backend(intra)} size {dist.get_world_size(intra)} "
          f"rank-in-group {dist.get_rank(intra)} global-of-0 {dist.get_global_rank(intra, 0)}", flush=True)
    t = torch.tensor([float(rank)], device=f"cuda:{local_rank}" if torch.cuda.is_available() else "cpu")
    dist.all_reduce(t, group=intra)
    print(f"[rank{rank}] node sum {t.item()} device-type-of-result {t.device.type}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
