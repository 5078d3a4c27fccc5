"""A GPU script that reaches a CUDA-only call the simulated GPUs do not model: the legacy
typed constructor `torch.cuda.FloatTensor(n)` (CUDA's own storage type; torch's CPU build
raises "type torch.cuda.FloatTensor not available. Torch not compiled with CUDA enabled.").
Started torchrun-style."""

import os

import torch
import torch.distributed as dist


def main():
    torch.cuda.set_device(int(os.environ["LOCAL_RANK"]))
    dist.init_process_group("nccl")
    buf = torch.cuda.FloatTensor(4).zero_()
    dist.all_reduce(buf)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
