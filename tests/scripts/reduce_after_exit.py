"""A reduce posted after its only peer left (2 ranks, root 1). Gloo's ring reduce starts by
posting a receive from and a send to the peer (gloo/reduce.cc), so the root fails with the
peer's closed socket at once, as an all_reduce does, instead of waiting for its timeout.
Found by bench/script_sweep.py: the simulator did not model reduce message by message and
judged it as a hang until the PG timeout."""

import datetime
import sys

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    rank = dist.get_rank()
    if rank == 0:
        dist.send(torch.ones(2), dst=1)
        print("[0] leaving", flush=True)
        sys.exit(3)
    got = torch.zeros(2)
    dist.recv(got, src=0)
    print(f"[1] recv {got.tolist()}", flush=True)
    x = torch.full((4,), 3, dtype=torch.int32)
    dist.reduce(x, dst=1)
    print(f"[1] reduce {x.tolist()}", flush=True)


if __name__ == "__main__":
    main()
