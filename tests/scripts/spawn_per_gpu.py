"""One rank a GPU the process sees, by mp.spawn (as rasbt/LLMs-from-scratch's DDP-script.py):
the world is `torch.cuda.device_count()`, so `CUDA_VISIBLE_DEVICES` sizes it. Run as-is."""

import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp


def work(rank: int, world: int) -> None:
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29533")
    dist.init_process_group("gloo", rank=rank, world_size=world)
    torch.cuda.set_device(rank)
    print(f"[{rank}] of {world}: count {torch.cuda.device_count()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    world = torch.cuda.device_count()
    mp.spawn(work, args=(world,), nprocs=world)
