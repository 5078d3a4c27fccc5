"""Gathering arbitrary objects the way fairseq's all_gather_list did before all_gather_object:
one shared byte buffer of max_size slots per rank; each rank writes a 4-byte length header and
its pickled object into its own slot of a zeroed buffer, and one all_reduce SUM of the uint8
buffer gives everyone every slot. Used for logging outputs (per-rank loss sums, sample counts)
and for an all_reduce_dict of metrics.

An object larger than its slot makes that rank raise ValueError before the all_reduce while
the others are already in it: --big R makes rank R's logging output too large.

    torchrun --nproc-per-node 3 examples/all_gather_list_buffer.py [--big 1]
    simdist compare examples/all_gather_list_buffer.py --nproc-per-node 3 -- --big 1
"""

import argparse
import pickle

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP

HEADER = 4


def all_gather_list(data, max_size=1024):
    rank, world = dist.get_rank(), dist.get_world_size()
    buffer = torch.zeros(max_size * world, dtype=torch.uint8)
    enc = pickle.dumps(data)
    size = len(enc)
    if size + HEADER > max_size:
        raise ValueError(f"encoded data size ({size + HEADER}) exceeds max_size ({max_size})")
    header = size.to_bytes(HEADER, byteorder="big")
    start = rank * max_size
    buffer[start : start + HEADER + size] = torch.tensor(list(header + enc), dtype=torch.uint8)
    dist.all_reduce(buffer)
    out = []
    for i in range(world):
        slot = buffer[i * max_size : (i + 1) * max_size]
        n = int.from_bytes(bytes(slot[:HEADER].tolist()), byteorder="big")
        out.append(pickle.loads(bytes(slot[HEADER : HEADER + n].tolist())))
    return out


def all_reduce_dict(data):
    keys = sorted(data)
    t = torch.stack([torch.as_tensor(data[k], dtype=torch.float64) for k in keys])
    dist.all_reduce(t)
    return dict(zip(keys, t.tolist()))


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=4)
    ap.add_argument("--big", type=int, default=-1)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(6, 1))
    opt = torch.optim.Adam(model.parameters(), lr=0.05)
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        n = 4 + rank
        x = torch.randn(n, 6, generator=g)
        loss = F.mse_loss(model(x), x[:, :1], reduction="sum")
        opt.zero_grad()
        loss.backward()
        opt.step()
        log = {"loss": loss.item(), "nsentences": n, "rank": rank}
        if rank == args.big and step == 2:
            log["debug"] = list(range(1000, 1400))
        logs = all_gather_list(log)
        total = sum(entry["nsentences"] for entry in logs)
        mean = sum(entry["loss"] for entry in logs) / total
        stats = all_reduce_dict({"nsentences": n, "loss": loss.item(), "ntokens": n * 6})
        if rank == 0:
            print(f"step {step}: {total} sentences, loss/sentence {mean:.6f}, ntokens {stats['ntokens']:.0f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
