"""A scatter or gather after a member has left (`python rooted_after_exit.py scatter|gather
[root|leaf]`, 3 or more ranks). All ranks broadcast; then the op's root (rank 0 for the
scatter, the last rank for the gather) or, with `leaf`, the last leaf leaves, and the others
call the op. Gloo's scatter is the root's send to each other rank, its gather each rank's
send to the root (gloo/scatter.cc, gather.cc), so with the root gone every other rank fails
at once with its closed socket ("Connection closed by peer"), as torch's
`visualize_sharding_example.py` shows when rank 0 raises before `distribute_tensor`'s
scatter; with a leaf gone only the root fails, and the other leaves complete, a scatter's
with its block of the root's input. The simulator did not model either op message by
message and left the ranks hanging."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def wait_gone(limit_s: float = 30.0) -> None:
    """Until the leaver's process has ended (its pid in `leaver.pid`; gone from /proc or a
    zombie): its exit closes its sockets, and a loaded host can take a second or more to
    tear a process down, which a fixed sleep does not cover."""
    deadline = time.monotonic() + limit_s
    while time.monotonic() < deadline:
        try:
            with open("leaver.pid") as f:
                pid = int(f.read())
            with open(f"/proc/{pid}/stat") as f:
                if f.read().rsplit(")", 1)[1].split()[0] in ("Z", "X"):
                    return
        except FileNotFoundError as e:
            if "leaver" not in str(e.filename):
                return  # no /proc entry: the process is gone
        except ProcessLookupError:
            return  # its /proc entry went while being read (ESRCH): gone
        time.sleep(0.01)


def main():
    op, who = sys.argv[1], sys.argv[2] if len(sys.argv) > 2 else "root"
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    rank, world = dist.get_rank(), dist.get_world_size()
    root = 0 if op == "scatter" else world - 1
    leaver = root if who == "root" else max(r for r in range(world) if r != root)
    t = torch.arange(4.0) if rank == root else torch.zeros(4)
    dist.broadcast(t, src=root)
    print(f"[{rank}] broadcast {t.tolist()}", flush=True)
    if rank == leaver:
        with open("leaver.tmp", "w") as f:
            f.write(str(os.getpid()))
        os.replace("leaver.tmp", "leaver.pid")
        sys.exit(0)  # not a failure: torchrun's agent (and simdist's) would end the others at a non-zero exit
    if who == "leaf":
        wait_gone()  # the leaf's sockets are closed before the root posts to it, however loaded the host
        if rank == root:
            # The other leaves post first: Gloo's send of an unbound buffer waits for the
            # receiver's "ready" notice, so a leaf whose notice came after the root failed
            # (and went on to exit) loses the root instead of completing: a race of real
            # processes that the program must not leave to the scheduler.
            time.sleep(0.5)
    if op == "scatter":
        out = torch.zeros(2)
        blocks = [torch.full((2,), 10.0 + r) for r in range(world)] if rank == root else None
        dist.scatter(out, blocks, src=root)
        print(f"[{rank}] scatter {out.tolist()}", flush=True)
    else:
        bins = [torch.zeros(2) for _ in range(world)] if rank == root else None
        dist.gather(torch.full((2,), float(rank)), bins, dst=root)
        print(f"[{rank}] gathered", flush=True)


if __name__ == "__main__":
    main()
