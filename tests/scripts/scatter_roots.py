"""scatter with different roots on different ranks (`python scatter_roots.py --case
split|own|swap`, 2 or more ranks). `split`: the last rank names itself the root, the others
rank 0; `own`: every rank names itself; `swap`: rank 0 names the last rank, the others rank 0.
Gloo's scatter (gloo/scatter.cc) is the root's send of block i to each rank i, and a leaf's
receive from its root, in one slot: a rank that names itself root sends to ranks that post
no receive from it, so it waits for its sends until the PG timeout (real Gloo: a hang), and
a leaf whose root is not a root waits for its receive likewise."""

import argparse
import datetime

import torch
import torch.distributed as dist


def root_of(case: str, rank: int, world: int) -> int:
    """The `src` this rank passes to scatter."""
    last = world - 1
    if case == "split":
        return last if rank == last else 0
    if case == "own":
        return rank
    if case == "swap":
        return last if rank == 0 else 0
    raise SystemExit(f"--case: unknown case {case!r} (split, own, swap)")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", default="split")
    ap.add_argument("--timeout", type=float, default=5.0)
    args = ap.parse_args()
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=args.timeout))
    rank, world = dist.get_rank(), dist.get_world_size()
    src = root_of(args.case, rank, world)
    out = torch.zeros(2)
    blocks = [torch.full((2,), 10.0 + r) for r in range(world)] if rank == src else None
    print(f"[{rank}] scatter src={src}", flush=True)
    dist.scatter(out, blocks, src=src)
    print(f"[{rank}] scatter {out.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
