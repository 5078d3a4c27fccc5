"""A torchrun-style script using what evaluation and bookkeeping code uses beside DDP:
object collectives (broadcast_object_list, gather_object, scatter_object_list,
all_gather_object of uneven objects), subgroups from new_group (ranks outside a group
calling its collectives, objects and barriers on a subgroup, a group listed out of order),
and async work waited out of order (is_completed, get_future().then()). Any world size >= 2."""

import argparse
import logging
import os

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


def p(msg):
    print(f"[rank {dist.get_rank()}] {msg}", flush=True)


def objects(rank, world):
    cfg = [{"lr": 0.1, "epochs": 3, "tags": ["a", "b"]} if rank == 0 else None, None]
    dist.broadcast_object_list(cfg, src=0)
    p(f"config {cfg}")
    stats = {"rank": rank, "seen": list(range(rank * 3))}  # a different pickled size per rank
    everyone = [None] * world
    dist.all_gather_object(everyone, stats)
    p(f"all stats {everyone}")
    got = [None] * world if rank == world - 1 else None
    dist.gather_object(("loss", rank * 0.5), got, dst=world - 1)
    p(f"gathered {got}")
    out = [None]
    dist.scatter_object_list(out, [{"shard": k, "files": [f"f{k}"] * (k + 1)} for k in range(world)]
                             if rank == 1 else None, src=1)
    p(f"my shard {out[0]}")


def subgroups(rank, world):
    evens = dist.new_group([r for r in range(world) if r % 2 == 0])
    tail = dist.new_group(list(reversed(range(1, world))))  # listed out of order
    p(f"rank in evens {dist.get_rank(evens)}, in tail {dist.get_rank(tail)}")
    p(f"backend {dist.get_backend()}, evens {dist.get_backend(evens) if rank % 2 == 0 else '-'}")
    t = torch.tensor([float(rank + 1)])
    work = dist.all_reduce(t, group=evens)  # ranks outside the group: a no-op (and None)
    p(f"evens all_reduce -> {t.item()} work={'None' if work is None else 'Work'}")
    t = torch.arange(3.0) + rank
    dist.broadcast(t, src=world - 1, group=tail)  # src is a global rank
    p(f"tail broadcast -> {t.tolist()}")
    if rank in dist.get_process_group_ranks(tail):
        objs = [None] * dist.get_world_size(tail)
        dist.all_gather_object(objs, f"r{rank}", group=tail)
        p(f"tail objects {objs}")
        dist.barrier(group=tail)
    names = [f"n{rank}" if rank == 0 else None]
    dist.broadcast_object_list(names, src=0, group=evens)
    p(f"evens object {names}")
    ws = [None] * world
    dist.all_gather_object(ws, dist.get_world_size(evens) if rank % 2 == 0 else -1)
    p(f"group sizes {ws}")
    dist.destroy_process_group(tail)


def async_work(rank, world):
    a, b, c = torch.ones(4) * rank, torch.arange(3.0) * (rank + 1), torch.tensor([rank])
    wa = dist.all_reduce(a, async_op=True)
    wb = dist.broadcast(b, src=world - 1, async_op=True)
    wc = dist.all_reduce(c, op=dist.ReduceOp.MAX, async_op=True)
    fut = dist.all_reduce(torch.ones(2) * (rank + 1), async_op=True).get_future()
    doubled = fut.then(lambda f: f.value()[0] * 2)
    wc.wait()
    wb.wait()
    p(f"out of order: c={c.tolist()} b={b.tolist()} b done={wb.is_completed()}")
    wa.wait()
    p(f"a={a.tolist()} a done={wa.is_completed()} then={doubled.wait().tolist()}")
    outs = [torch.zeros(2) for _ in range(world)]
    work = dist.all_gather(outs, torch.tensor([rank, -rank], dtype=torch.float32), async_op=True)
    gathered = work.get_future().wait()
    p(f"all_gather future -> {[t.tolist() for t in gathered[0]]}")
    work.wait()
    p(f"all_gather result() -> {[t.tolist() for t in work.result()]}")
    flat = torch.zeros(2 * world)
    work = dist.all_gather_into_tensor(flat, torch.tensor([rank, rank + 0.5]), async_op=True)
    p(f"all_gather_into_tensor future -> {[t.tolist() for t in work.get_future().wait()]}")
    shard = torch.zeros(1)
    work = dist.reduce_scatter_tensor(shard, torch.arange(float(world)), async_op=True)
    try:
        work.get_future()
    except RuntimeError as e:
        p(f"reduce_scatter_tensor future: {e}")
    work.wait()
    p(f"shard {shard.tolist()}")
    work = dist.reduce_scatter(shard, [torch.full((1,), float(k + rank)) for k in range(world)], async_op=True)
    try:
        p(f"reduce_scatter (list) future -> {[t.tolist() for t in work.get_future().wait()]}")
    except RuntimeError as e:
        p(f"reduce_scatter (list) future: {e}")
    work.wait()
    p(f"list shard {shard.tolist()}")
    if rank < 2:
        buf = torch.tensor([float(rank)])
        req = dist.isend(buf, 1) if rank == 0 else dist.irecv(buf, 0)
        try:
            req.get_future()
        except RuntimeError as e:
            p(f"p2p future: {e}")
        req.wait()
        p(f"p2p got {buf.tolist()}")
    w = dist.barrier(async_op=True)
    w.wait()
    p(f"barrier work done={w.is_completed()}")


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=1)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO)
    torch.manual_seed(args.seed)
    dist.init_process_group(os.environ.get("BACKEND", "gloo"), init_method="env://")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    log.info("rank %s/%s local %s", rank, world, os.environ.get("LOCAL_RANK"))
    objects(rank, world)
    subgroups(rank, world)
    async_work(rank, world)
    dist.barrier()
    dist.destroy_process_group()
    p("bye") if dist.is_initialized() else print(f"[{rank}] bye, initialized={dist.is_initialized()}")


if __name__ == "__main__":
    main()
