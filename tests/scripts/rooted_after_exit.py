"""A scatter or gather whose root has left (`python rooted_after_exit.py scatter|gather`,
3 or more ranks). All ranks broadcast; then the root of the next op exits (rank 0 for the
scatter, the last rank for the gather) and the others call it. Gloo's scatter is a receive
from the root on every other rank, its gather a send to the root (gloo/scatter.cc,
gather.cc), so each fails at once with the root's closed socket ("Connection closed by
peer"), as torch's `visualize_sharding_example.py` shows when rank 0 raises before
`distribute_tensor`'s scatter. The simulator did not model either message by message and
left the ranks hanging."""

import datetime
import sys

import torch
import torch.distributed as dist


def main():
    op = sys.argv[1]
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    root = 0 if op == "scatter" else world - 1
    t = torch.arange(4.0) if rank == root else torch.zeros(4)
    dist.broadcast(t, src=root)
    print(f"[{rank}] broadcast {t.tolist()}", flush=True)
    if rank == root:
        sys.exit(3)
    if op == "scatter":
        out = torch.zeros(2)
        dist.scatter(out, None, src=root)
        print(f"[{rank}] scatter {out.tolist()}", flush=True)
    else:
        dist.gather(torch.full((2,), float(rank)), None, dst=root)
        print(f"[{rank}] gathered", flush=True)


if __name__ == "__main__":
    main()
