"""FSDP's sharded state dict saved and loaded with torch.distributed.checkpoint, on a layer
so small that a rank holds no shard of some parameter (2 ranks: Linear(2, 1) is 3 elements,
rank 0 holds the weight, rank 1 the bias). DCP asks such a ShardedTensor its `device`,
which torch answers from the group's backend name: the CPU under "gloo", else
`torch.device(torch.cuda.current_device())`. Simulated groups answered "simdist", so the
load failed there ("Cannot access accelerator device when none is available") and
completed on real Gloo (torch's `fsdp_checkpoint_example.py` on 8 ranks). Also prints
what a script sees of its group's backend."""

import os

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.fsdp import FullyShardedDataParallel as FSDP
from torch.distributed.fsdp import StateDictType


def build(seed: int) -> FSDP:
    torch.manual_seed(seed)
    return FSDP(torch.nn.Linear(2, 1).cuda(dist.get_rank()))


def main():
    dist.init_process_group("cpu:gloo,cuda:nccl")
    rank = dist.get_rank()
    world = dist.group.WORLD
    print(f"[{rank}] backend {world._get_backend_name()} {world.name()} {dist.get_backend()}", flush=True)
    path = os.path.abspath("fsdp_empty_shard_ckpt")
    saved = build(0)
    with FSDP.state_dict_type(saved, StateDictType.SHARDED_STATE_DICT):
        dcp.save({"model": saved.state_dict()}, checkpoint_id=path)
    loaded = build(1)
    with FSDP.state_dict_type(loaded, StateDictType.SHARDED_STATE_DICT):
        state = {"model": loaded.state_dict()}
        dcp.load(state, checkpoint_id=path)
        loaded.load_state_dict(state["model"])
    with FSDP.summon_full_params(loaded):
        print(f"[{rank}] loaded {loaded.weight.tolist()} {loaded.bias.tolist()}", flush=True)


if __name__ == "__main__":
    main()
