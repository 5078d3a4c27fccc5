"""A send/recv before rooted and reducing collectives (2 ranks): Gloo's sequence number
counts the p2p operations, the Flight Recorder's collective numbers do not, so the real
side noted each collective's root and reduce op one collective late (found by
bench/script_sweep.py: a broadcast_object_list's root landed on the all_gather after it)."""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    msg = torch.arange(3.0) * (rank + 1)
    if rank == 0:
        dist.send(msg, dst=1)
    else:
        dist.recv(msg, src=0)
    t = torch.full((2,), float(rank + 1))
    dist.broadcast(t, src=1)
    dist.all_reduce(t, op=dist.ReduceOp.MAX)
    u = torch.full((2,), float(rank + 5))
    dist.reduce(u, dst=1, op=dist.ReduceOp.MIN)
    print(f"[{rank}] {msg.tolist()} {t.tolist()} {u.tolist() if rank == 1 else ''}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
