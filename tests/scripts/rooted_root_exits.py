"""A rooted collective whose root posts its part and exits at once (`python rooted_root_exits.py
broadcast|scatter|reduce|gather|all_reduce
[async|fails|gone]`, 2 or more ranks; the root is rank 0).

`async`: the root issues the op with `async_op=True` and exits without waiting on it; the
others issue it as usual. `fails` (3 or more ranks): the last rank exits after the first
broadcast and the others issue the op at once, while its process is still unwinding: the
root's message with it fails the root once its sockets close. `gone`: the same, but the
others issue the op once the last rank's process is gone (`rooted_after_exit.wait_gone`): the
root fails as it posts its message with the gone rank, right after posting those with the
live ones, and exits with the error.

What do the others get: the root's data (its sends were written before its sockets closed) or
its closure ("Connection closed by peer")? That is what this script measures; see
`simdist.races` for the counts."""

import datetime
import os
import sys

import torch
import torch.distributed as dist
from rooted_after_exit import wait_gone


def issue(op: str, rank: int, world: int, async_op: bool):
    """One call of `op` rooted at rank 0; the root's input is 10 + rank per element."""
    if op == "broadcast":
        t = torch.full((4,), 10.0) if rank == 0 else torch.zeros(4)
        return t, dist.broadcast(t, src=0, async_op=async_op)
    if op == "scatter":
        out = torch.zeros(2)
        blocks = [torch.full((2,), 10.0 + r) for r in range(world)] if rank == 0 else None
        return out, dist.scatter(out, blocks, src=0, async_op=async_op)
    if op == "reduce":
        t = torch.full((4,), 10.0 + rank)
        return t, dist.reduce(t, dst=0, async_op=async_op)
    if op == "all_reduce":  # not rooted: the same exit, for comparison
        t = torch.full((4,), 10.0 + rank)
        return t, dist.all_reduce(t, async_op=async_op)
    bins = [torch.zeros(2) for _ in range(world)] if rank == 0 else None
    t = torch.full((2,), 10.0 + rank)
    return t, dist.gather(t, bins, dst=0, async_op=async_op)


def main():
    op, how = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "async"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    if rank == 0 and os.path.exists("leaver.pid"):
        os.remove("leaver.pid")  # a previous run's, in the same directory: before the leaver can write it
    t = torch.ones(1)
    dist.broadcast(t, src=0)
    if how in ("fails", "gone") and rank == world - 1:
        with open("leaver.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace("leaver.tmp", "leaver.pid")
        sys.exit(3)
    if how == "gone":
        wait_gone()
    if rank == 0 and how == "async":
        issue(op, rank, world, async_op=True)
        print("[0] posted", flush=True)
        sys.exit(3)
    got, _ = issue(op, rank, world, async_op=False)
    print(f"[{rank}] {op} {got.tolist()}", flush=True)


if __name__ == "__main__":
    main()
