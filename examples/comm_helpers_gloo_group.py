"""detectron2-style communication helpers: object collectives go over a second, Gloo group
with a 5 s timeout, made lazily the first time a helper needs it (functools.lru_cache around
dist.new_group(backend="gloo"), as detectron2 does when the main backend is NCCL); shared_random_seed all_gathers
each rank's random integer and everyone takes rank 0's; reduce_dict stacks a loss dict, reduces
it to rank 0, which alone divides by the world size; gather() collects objects on rank 0 only.

The helpers are collectives, including the lazy group's creation: --bug calls gather() for the
first time inside `if is_main_process():`, so only rank 0 creates the Gloo group.

    torchrun --nproc-per-node 4 examples/comm_helpers_gloo_group.py [--bug]
    simdist compare examples/comm_helpers_gloo_group.py --nproc-per-node 4
"""

import argparse
import functools
from datetime import timedelta

import numpy as np
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


@functools.lru_cache()
def _get_global_gloo_group():
    """Objects go over a CPU group of their own, with a shorter timeout than training's."""
    return dist.new_group(backend="gloo", timeout=timedelta(seconds=5))


def is_main_process():
    return dist.get_rank() == 0


def synchronize():
    dist.barrier()


def all_gather(data):
    out = [None] * dist.get_world_size()
    dist.all_gather_object(out, data, group=_get_global_gloo_group())
    return out


def gather(data, dst=0):
    group = _get_global_gloo_group()
    if dist.get_rank() == dst:
        out = [None] * dist.get_world_size()
        dist.gather_object(data, out, dst=dst, group=group)
        return out
    dist.gather_object(data, None, dst=dst, group=group)
    return []


def shared_random_seed():
    return all_gather(np.random.randint(2**31))[0]


def reduce_dict(input_dict, average=True):
    with torch.no_grad():
        names = sorted(input_dict)
        values = torch.stack([input_dict[k] for k in names])
        dist.reduce(values, dst=0)
        if dist.get_rank() == 0 and average:
            values /= dist.get_world_size()
        return dict(zip(names, values))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--iters", type=int, default=3)
    ap.add_argument("--bug", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank = dist.get_rank()
    device = torch.device("cuda", rank) if torch.cuda.is_available() else torch.device("cpu")
    if torch.cuda.is_available():
        torch.cuda.set_device(device)
    np.random.seed(100 + rank)
    if not args.bug:
        seed = shared_random_seed()
        print(f"rank {rank}: shared seed {seed}", flush=True)
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 2).to(device), device_ids=[rank] if device.type == "cuda" else None)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for it in range(args.iters):
        x = torch.randn(8, 4, generator=g).to(device)
        out = model(x)
        losses = {"loss_cls": F.cross_entropy(out, (x[:, 0] > 0).long()), "loss_reg": out.pow(2).mean()}
        opt.zero_grad()
        sum(losses.values()).backward()
        opt.step()
        reduced = reduce_dict(losses)
        if is_main_process():
            print(f"iter {it}: " + " ".join(f"{k}={v.item():.6f}" for k, v in reduced.items()), flush=True)
    synchronize()
    result = {"rank": rank, "n": 8 * args.iters}
    if args.bug:
        if is_main_process():
            parts = gather(result)
            print("gathered", parts, flush=True)
    else:
        parts = gather(result)
        if is_main_process():
            print("gathered", parts, flush=True)
    synchronize()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
