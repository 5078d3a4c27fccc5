"""A broadcast's rank fed by a root that then times out on a late sibling (3 ranks): Gloo's
tree from rank 0 sends to ranks 1 and 2; rank 1 gets its message at once and completes; rank
2 comes 0.6 s late, after the root's send to it ran out (0.3 s) and closed the root's pairs,
and fails with the peer gone. The simulator had failed rank 1 too, with the root's closure.

With --catch every rank catches its error, prints it and exits 0: no process fails, so
torchrun's agent never acts and the whole chain shows (tests/test_script_catch_chains.py)."""

import datetime
import sys
import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = dist.new_group(timeout=datetime.timedelta(seconds=(0.3, 30.0, 30.0)[rank]))  # the root's own
    if rank == 2:
        time.sleep(0.6)
    t = torch.full((4,), float(rank))
    try:
        dist.broadcast(t, src=0, group=g)
        print(f"[{rank}] got {t.tolist()}", flush=True)
    except RuntimeError as e:
        print(f"[{rank}] {'timed out' if 'Timed out' in str(e) else 'peer gone'}", flush=True)
        if "--catch" not in sys.argv[1:]:
            raise


if __name__ == "__main__":
    main()
