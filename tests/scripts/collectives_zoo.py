"""Every collective torch offers, on random data, each result printed as a digest of its
exact bytes: run on simulated ranks and on real Gloo, the printed lines must be equal
(tests/test_script_examples.py). Started torchrun-style, any world size >= 2."""

import hashlib

import torch
import torch.distributed as dist

R = dist.ReduceOp


def digest(name, *tensors):
    h = hashlib.sha256()
    for t in tensors:
        h.update(t.contiguous().view(torch.uint8).numpy().tobytes())
    print(f"{name}: {h.hexdigest()[:16]}")


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    g = torch.Generator().manual_seed(1000 + rank)

    def rand(n, dtype=torch.float32):
        x = torch.randn(n, generator=g) * 10 ** torch.randint(-3, 4, (n,), generator=g)
        return x.to(dtype)

    for dtype in (torch.float32, torch.float64, torch.float16, torch.bfloat16):
        for op in (R.SUM, R.AVG, R.MAX, R.MIN, R.PRODUCT):
            t = rand(257, dtype)
            dist.all_reduce(t, op=op)
            digest(f"all_reduce {dtype} {op}", t)
    t = torch.randint(-1000, 1000, (33,), generator=g)
    dist.all_reduce(t)
    digest("all_reduce int64", t)
    t = rand(1000)
    dist.reduce(t, dst=world - 1)
    digest("reduce", t)
    t = rand(5)
    fut = dist.all_reduce(t, async_op=True).get_future()
    digest("all_reduce async future", fut.wait()[0])

    for op in (R.SUM, R.AVG, R.MAX):
        ins = [rand(3 + k) for k in range(world)]
        out = torch.empty(3 + rank)
        dist.reduce_scatter(out, ins, op=op)
        digest(f"reduce_scatter list uneven {op}", out, *ins)
        big = rand(7 * world)
        out = torch.empty(7)
        dist.reduce_scatter_tensor(out, big, op=op)
        digest(f"reduce_scatter_tensor {op}", out, big)

    x = rand(6)
    outs = [torch.empty(6) for _ in range(world)]
    dist.all_gather(outs, x)
    digest("all_gather", *outs)
    flat = torch.empty(6 * world)
    dist.all_gather_into_tensor(flat, x)
    digest("all_gather_into_tensor", flat)
    gathered = [torch.empty(6) for _ in range(world)] if rank == 0 else None
    dist.gather(x, gathered, dst=0)
    if rank == 0:
        digest("gather", *gathered)
    out = torch.empty(4)
    dist.scatter(out, [rand(4) for _ in range(world)] if rank == 1 else None, src=1)
    digest("scatter", out)
    t = rand(9)
    dist.broadcast(t, src=world - 1)
    digest("broadcast", t)

    recvs = [torch.empty(2, 3) for _ in range(world)]
    dist.all_to_all(recvs, [rand(6).view(2, 3) for _ in range(world)])
    digest("all_to_all", *recvs)
    try:  # Gloo takes equal tensors only
        dist.all_to_all([torch.empty(1 + (k + rank) % 3) for k in range(world)],
                        [rand(1 + (rank + k) % 3) for k in range(world)])
    except RuntimeError as e:
        print("all_to_all uneven:", e)
    in_splits = [1 + (rank + k) % 3 for k in range(world)]
    out_splits = [1 + (k + rank) % 3 for k in range(world)]
    inp = rand(sum(in_splits) * 2).view(-1, 2)
    out = torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(out, inp, out_splits, in_splits)
    digest("all_to_all_single uneven", out)

    right, left = (rank + 1) % world, (rank - 1) % world
    send, recv = rand(8), torch.empty(8)
    for w in dist.batch_isend_irecv([dist.P2POp(dist.isend, send, right), dist.P2POp(dist.irecv, recv, left)]):
        w.wait()
    digest("ring exchange", recv)
    if rank == 0:  # receives from any source; the senders take turns, so the order is fixed
        got = []
        for _ in range(world - 1):
            t = torch.empty(3)
            src = dist.recv(t)
            got.append((src, t.tolist()))
        print("recv from any source", got)
    else:
        token = torch.zeros(1)
        if rank > 1:
            dist.recv(token, src=rank - 1)
        dist.send(torch.full((3,), float(rank)), dst=0)
        if rank < world - 1:
            dist.send(token, dst=rank + 1)
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "x": float(rand(1))})
    print("objects", objs)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
