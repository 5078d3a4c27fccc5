"""Tensors as training code hands them to collectives: every reduce op on every dtype
(bitwise ops on floats and bool too), 0-dim, empty, non-contiguous and strided views,
mixed dtypes in one call; each result (or the error torch/Gloo raised) printed with a rank
prefix. Started torchrun-style, any world size >= 2."""

import argparse
import logging
import os

import torch
import torch.distributed as dist

R = dist.ReduceOp
log = logging.getLogger("tensor_kinds")


def attempt(rank, name, fn, *shown):
    try:
        fn()
        outcome = "ok"
    except (RuntimeError, ValueError, TypeError) as e:
        msg = str(e).splitlines()[0]
        # Gloo's CHECK_EQ messages start with a glog prefix holding the time: keep what follows
        outcome = f"{type(e).__name__}: {msg[msg.find('Check failed'):] if 'Check failed' in msg else msg}"
    print(f"[rank{rank}] {name}: {outcome} -> {[t.tolist() for t in shown]}", flush=True)


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s")
    dist.init_process_group(backend="gloo")
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    assert dist.is_initialized() and dist.get_rank() == rank and dist.get_world_size() == world
    log.info("rank %d of %d, backend %s", rank, world, dist.get_backend())
    torch.manual_seed(args.seed + rank)

    for dtype in (torch.float16, torch.bfloat16, torch.int64, torch.int32, torch.uint8, torch.bool):
        for op in (R.SUM, R.MIN, R.MAX, R.PRODUCT, R.BAND, R.BOR, R.BXOR):
            base = torch.tensor([rank + 1, 3 - rank, 2 * rank, 5]) % 4
            t = base.to(dtype)
            attempt(rank, f"all_reduce {dtype} {op}", lambda t=t, op=op: dist.all_reduce(t, op=op), t)
    for op in (R.BAND, R.BOR, R.BXOR):
        t = torch.tensor([5, 6, 7]) * (rank + 1)
        attempt(rank, f"reduce int64 {op}", lambda t=t, op=op: dist.reduce(t, dst=0, op=op), t)

    # int16: Gloo has no kernel for it; every collective fails at wait() ("Invalid scalar type"), p2p works
    h = torch.arange(4, dtype=torch.int16) + rank
    hs = [torch.zeros(4, dtype=torch.int16) for _ in range(world)]
    hflat = torch.zeros(4 * world, dtype=torch.int16)
    for name, fn in (("all_reduce", lambda: dist.all_reduce(h)), ("broadcast", lambda: dist.broadcast(h, src=0)),
                     ("reduce", lambda: dist.reduce(h, dst=0)), ("all_gather", lambda: dist.all_gather(hs, h)),
                     ("all_gather_into_tensor", lambda: dist.all_gather_into_tensor(hflat, h)),
                     ("reduce_scatter_tensor", lambda: dist.reduce_scatter_tensor(h, hflat)),
                     ("gather", lambda: dist.gather(h, hs if rank == 0 else None, dst=0)),
                     ("scatter", lambda: dist.scatter(h, hs if rank == 0 else None, src=0)),
                     ("all_to_all_single", lambda: dist.all_to_all_single(hflat, hflat)),
                     ("async all_reduce", lambda: dist.all_reduce(h, async_op=True).wait()),
                     ("send/recv", lambda: dist.send(h, dst=1) if rank == 0 else dist.recv(h, src=0) if rank == 1 else None)):
        attempt(rank, f"int16 {name}", fn, h)
    dist.barrier()

    scalar = torch.tensor(float(rank + 1))
    attempt(rank, "0-dim all_reduce", lambda: dist.all_reduce(scalar), scalar)
    loss = torch.tensor(2.5 * rank, dtype=torch.float64)
    attempt(rank, "0-dim broadcast", lambda: dist.broadcast(loss, src=world - 1), loss)
    outs = [torch.zeros(()) for _ in range(world)]
    attempt(rank, "0-dim all_gather", lambda: dist.all_gather(outs, scalar), *outs)
    empty = torch.empty(0)
    attempt(rank, "empty all_reduce", lambda: dist.all_reduce(empty), empty)
    eouts = [torch.empty(0, 3) for _ in range(world)]
    attempt(rank, "empty all_gather", lambda: dist.all_gather(eouts, torch.empty(0, 3)), *eouts)

    m = torch.arange(12.0).view(3, 4) + rank
    col = m[:, 1]
    attempt(rank, "non-contiguous all_reduce", lambda: dist.all_reduce(col), col, m)
    mt = (torch.arange(6.0).view(2, 3) * (rank + 1)).t()
    attempt(rank, "transposed broadcast", lambda: dist.broadcast(mt, src=0), mt)
    every_other = torch.arange(8.0)[::2] * (rank + 1)
    gouts = [torch.zeros(4) for _ in range(world)]
    attempt(rank, "strided all_gather input", lambda: dist.all_gather(gouts, every_other), *gouts)
    sliced = torch.arange(10.0)[2:6] + rank
    attempt(rank, "contiguous slice all_reduce", lambda: dist.all_reduce(sliced), sliced)

    m = torch.arange(12.0).view(3, 4) + 100 * rank  # Gloo takes these by pointer: the flat run they start
    attempt(rank, "non-contiguous reduce", lambda: dist.reduce(m[:, 2], dst=0), m)
    m = torch.arange(12.0).view(3, 4) + 100 * rank
    ins = [torch.arange(12.0).view(3, 4)[:, k] * 10 for k in range(world)] if rank == 0 else None
    attempt(rank, "non-contiguous scatter", lambda: dist.scatter(m[:, 1], ins, src=0), m)
    m = torch.arange(12.0).view(3, 4) + 100 * rank
    parts = [torch.zeros(3, 2) for _ in range(world)] if rank == world - 1 else None
    attempt(rank, "non-contiguous gather input", lambda: dist.gather(m[:, 1:3], parts, dst=world - 1), *(parts or []))
    out = torch.zeros(2, world)
    attempt(rank, "non-contiguous all_to_all_single", lambda: dist.all_to_all_single(out.t(), m[:world, :2]), out)
    attempt(rank, "non-contiguous send", lambda: dist.send(m[:, 0], dst=(rank + 1) % world) if rank == 0 else None)
    rows = torch.zeros(world, 3)
    attempt(rank, "all_gather_into_tensor (world, n) output", lambda: dist.all_gather_into_tensor(rows, m[0, :3]), rows)
    attempt(rank, "all_gather_into_tensor (world, n) from (1, n)",
            lambda: dist.all_gather_into_tensor(rows, m[0, :3].view(1, 3)), rows)
    shard = torch.zeros(2, 2)
    attempt(rank, "reduce_scatter_tensor (2, 2) from flat", lambda: dist.reduce_scatter_tensor(
        shard, torch.ones(4 * world)), shard)
    shard = torch.zeros(2, 2)
    attempt(rank, "reduce_scatter_tensor (2, 2) from (2 * world, 2)", lambda: dist.reduce_scatter_tensor(
        shard, torch.ones(2 * world, 2) * rank), shard)
    shard = torch.zeros(2, 3)  # Gloo compares the output's later dims with the input's at the call
    attempt(rank, "reduce_scatter_tensor (2, 3) from (2 * world, 2)", lambda: dist.reduce_scatter_tensor(
        shard, torch.ones(2 * world, 2)), shard)
    flat = torch.zeros(2)  # passes the checks; the copy out in wait() cannot broadcast (2, 3) into (2,)
    attempt(rank, "reduce_scatter_tensor (2,) from (2 * world, 3)", lambda: dist.reduce_scatter_tensor(
        flat, torch.arange(6.0 * world).view(2 * world, 3) + rank), flat)
    shard = torch.zeros(2, 3)  # async: the output gets its chunk in wait(), not when the all_reduce ends
    work = dist.reduce_scatter_tensor(shard, torch.arange(6.0 * world).view(2 * world, 3) + rank, async_op=True)
    dist.barrier()
    attempt(rank, "reduce_scatter_tensor async, before wait", lambda: None, shard)
    attempt(rank, "reduce_scatter_tensor async, after wait", work.wait, shard)

    a, b = torch.ones(2) * rank, torch.ones(3, dtype=torch.float64) * rank
    attempt(rank, "all_reduce_coalesced mixed dtypes", lambda: dist.all_reduce_coalesced([a, b]), a, b)
    x = torch.tensor([rank], dtype=torch.int64)
    mixed = [torch.zeros(1, dtype=torch.int32) for _ in range(world)]
    attempt(rank, "all_gather mixed dtypes", lambda: dist.all_gather(mixed, x), *mixed)
    big = torch.zeros(world + 1)
    attempt(rank, "all_gather_into_tensor wrong size", lambda: dist.all_gather_into_tensor(big, torch.ones(1)), big)

    done = torch.tensor([rank + 1])
    dist.all_reduce(done)
    print(f"[rank{rank}] final sum {done.item()}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
