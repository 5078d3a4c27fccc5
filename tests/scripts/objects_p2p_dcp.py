"""A torchrun-style script on the less travelled parts of torch.distributed that training
code still uses: a batch_isend_irecv ring (halo exchange) both ways, reduce / gather_object /
scatter_object_list / broadcast_object_list rooted at the last rank, all_gather_object of
uneven objects, barrier(device_ids=...) (ignored on Gloo), a torch.distributed.checkpoint
save (and async_save) and load of a DDP model's state_dict to a shared directory, and zero-element collectives
(Gloo completes an empty all_reduce, reduce and all_gather without waiting for the peers, not
an empty broadcast), and is_completed()/is_success() of p2p and reduce_scatter works. Any world size >= 2."""

import os
import shutil
import tempfile
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def ring(rank, world):
    right, left = (rank + 1) % world, (rank - 1) % world
    send_r, send_l = torch.full((3,), float(rank)), torch.full((2,), 10.0 + rank)
    from_l, from_r = torch.zeros(3), torch.zeros(2)
    ops = [dist.P2POp(dist.isend, send_r, right), dist.P2POp(dist.irecv, from_l, left),
           dist.P2POp(dist.isend, send_l, left), dist.P2POp(dist.irecv, from_r, right)]
    works = dist.batch_isend_irecv(ops)
    before = [w.is_completed() for w in works]  # Gloo: a p2p work's state before its wait
    for w in works:
        w.wait()
    print(f"[ring rank{rank}] completed before wait {before} after {[w.is_completed() for w in works]}", flush=True)
    print(f"[ring rank{rank}] from left {from_l.tolist()} from right {from_r.tolist()}", flush=True)


def rooted(rank, world):
    last = world - 1
    t = torch.arange(4.0) * (rank + 1)
    dist.reduce(t, dst=last, op=dist.ReduceOp.SUM)
    print(f"[reduce rank{rank}] {t.tolist()}", flush=True)  # non-roots keep Gloo's partial sums
    out = [None] * world if rank == last else None
    dist.gather_object({"rank": rank, "tokens": list(range(rank + 1))}, out, dst=last)
    print(f"[gather_object rank{rank}] {out}", flush=True)
    got = [None]
    dist.scatter_object_list(got, [f"shard-{i}" * (i + 1) for i in range(world)] if rank == last else None,
                             src=last)
    print(f"[scatter_object_list rank{rank}] {got}", flush=True)
    cfg = [{"lr": 0.1, "from": rank}, "x" * rank]
    dist.broadcast_object_list(cfg, src=last)
    print(f"[broadcast_object_list rank{rank}] {cfg}", flush=True)
    stats = [None] * world
    dist.all_gather_object(stats, {"rank": rank, "hist": [rank] * (3 * rank + 1), "name": "r" * rank})
    print(f"[all_gather_object rank{rank}] {stats}", flush=True)
    out = torch.zeros(2)
    work = dist.reduce_scatter_tensor(out, torch.arange(2.0 * world) + rank, async_op=True)
    work.wait()
    print(f"[reduce_scatter_tensor rank{rank}] {out.tolist()} completed {work.is_completed()} "
          f"success {work.is_success()}", flush=True)
    dist.barrier(device_ids=[rank])
    print(f"[barrier rank{rank}] passed", flush=True)


def empty(rank):
    if rank == 1:
        time.sleep(0.8)
    work = dist.all_reduce(torch.empty(0), async_op=True)
    time.sleep(0.3)
    print(f"[empty rank{rank}] done before the peers: {work.is_completed()}", flush=True)
    work.wait()
    fut = dist.all_reduce(torch.empty(0), async_op=True).get_future()
    print(f"[empty rank{rank}] future {fut.wait()}", flush=True)
    local = [dist.reduce(torch.empty(0), dst=0, async_op=True),
             dist.all_gather([torch.empty(0) for _ in range(dist.get_world_size())], torch.empty(0), async_op=True)]
    time.sleep(0.3)
    print(f"[empty rank{rank}] reduce, all_gather done before the peers: {[w.is_completed() for w in local]}",
          flush=True)
    for w in local:
        w.wait()
    dist.broadcast(torch.empty(0), src=0)  # not local on Gloo: it waits for the root
    gathered = [torch.ones(1) for _ in range(dist.get_world_size())]
    dist.all_gather(gathered, torch.ones(1) * rank)  # the ranks are still in step
    print(f"[empty rank{rank}] then {[g.item() for g in gathered]}", flush=True)


def checkpoint(rank):
    torch.manual_seed(rank)  # replicas differ until DDP broadcasts rank 0's
    model = DDP(nn.Sequential(nn.Linear(4, 3), nn.ReLU(), nn.Linear(3, 1)))
    names = [os.environ.get("CKPT_DIR") or tempfile.gettempdir(), f"dcp_{os.environ.get('TORCHELASTIC_RUN_ID', 'x')}"]
    path = [os.path.join(names[0], f"{names[1]}_{os.getppid()}")] if rank == 0 else [None]
    dist.broadcast_object_list(path, src=0)
    dcp.save({"model": model.state_dict()}, checkpoint_id=path[0])
    print(f"[dcp rank{rank}] group devices {[d.type for d in dist.group.WORLD._device_types]}", flush=True)
    # async_save wants a group with a CPU backend; it saves on a thread of its own
    dcp.async_save({"model": model.state_dict()}, checkpoint_id=path[0] + "_async").result()
    with torch.no_grad():
        for p in model.parameters():
            p.zero_()
    state = {"model": model.state_dict()}
    dcp.load(state, checkpoint_id=path[0] + "_async")
    model.load_state_dict(state["model"])
    total = sum(p.detach().sum() for p in model.parameters())
    print(f"[dcp rank{rank}] restored {total.item():.8f} files {sorted(os.listdir(path[0]))}", flush=True)
    dist.barrier()
    if rank == 0:
        shutil.rmtree(path[0])
        shutil.rmtree(path[0] + "_async")


def main():
    dist.init_process_group("gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    ring(rank, world)
    rooted(rank, world)
    empty(rank)
    checkpoint(rank)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
