"""all_to_all_single sizes Gloo's algorithms refuse as they run, before any message: alltoall
(no split sizes) with input and output of different sizes (gloo/alltoall.cc), and alltoallv
(split sizes given) where a rank sends itself another count than it receives from itself
(gloo/alltoallv.cc). The work fails at wait() with Gloo's enforce; peers that do exchange
wait for the refusing rank's messages until its process ends. Step 1: every rank's alltoall
is refused, and the group still pairs; step 2: rank 0's alltoallv alone is refused, and the
others fail when it exits. Started torchrun-style, any world size >= 2."""

import datetime

import torch
import torch.distributed as dist


def attempt(rank, name, fn, full):
    try:
        fn()
        print(f"[{rank}] {name}: ok", flush=True)
    except RuntimeError as e:
        print(f"[{rank}] {name}: RuntimeError{f' {e}' if full else ''}", flush=True)


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    x, y = torch.arange(2.0 * world), torch.zeros(3 * world)
    attempt(rank, "alltoall", lambda: dist.all_to_all_single(y, x), True)
    t = torch.ones(1)
    dist.all_reduce(t)  # the group still pairs
    print(f"[{rank}] sum {t.tolist()}", flush=True)
    ins = [1] + [2] * (world - 1) if rank == 0 else [2] * world
    x, y = torch.arange(float(sum(ins))), torch.zeros(2 * world)
    attempt(rank, "alltoallv", lambda: dist.all_to_all_single(y, x, [2] * world, ins), rank == 0)


if __name__ == "__main__":
    main()
