"""An all_to_all without split sizes (Gloo's alltoall) on rank 0 meets all_to_all_single given
even split sizes (Gloo's alltoallv) on the other ranks. gloo/alltoall.cc and alltoallv.cc
build their slot from the same prefix (kAlltoallSlotPrefix) and post the same messages for
even counts, so the calls pair and complete (torch 2.13, measured). `--how`: rank 0's form:
`single` (all_to_all_single with no split sizes), `empty` (split sizes []: none given, as
torch reads them) or `list` (dist.all_to_all). Started torchrun-style, any world size >= 2."""

import argparse
import datetime

import torch
import torch.distributed as dist


def main():
    how = argparse.ArgumentParser()
    how.add_argument("--how", choices=["single", "empty", "list"], default="single")
    how = how.parse_args().how
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3))
    rank, world = dist.get_rank(), dist.get_world_size()
    x = torch.arange(2.0 * world) + 10 * rank
    y = torch.zeros(2 * world)
    if rank != 0:
        dist.all_to_all_single(y, x, [2] * world, [2] * world)
    elif how == "list":
        outs = [torch.zeros(2) for _ in range(world)]
        dist.all_to_all(outs, list(x.split(2)))
        y = torch.cat(outs)
    else:
        dist.all_to_all_single(y, x, *([[], []] if how == "empty" else []))
    print(f"[{rank}] {y.tolist()}", flush=True)


if __name__ == "__main__":
    main()
