"""Which waits a peer's exit fails on Gloo (3 ranks, one group, 5 s timeout): only an operation
with a message still pending with the peer (Gloo's pair closure reaches the buffers queued on
that pair), at once; a wait on another pair of the same group goes on.

--case isend: rank 0 isends to ranks 1 and 2 and waits on the send to rank 2 first; rank 1
    leaves without receiving; rank 2 receives 0.5 s late. Rank 0's send to rank 2 completes,
    then its send to rank 1 fails with the peer gone.
--case fed: a broadcast from rank 0; rank 1 gets it and leaves; rank 2 posts 0.5 s late. The
    root's wait on its send to rank 2 goes on past rank 1's exit: every rank completes.
--case unfed: the same broadcast; rank 1 leaves (os._exit) without posting, rank 2 posts 0.8 s late. The
    root's broadcast (one buffer for both sends) fails with rank 1's closure, before rank 2 posts.
With --catch every rank catches its error, prints it and exits 0: no process fails, so
torchrun's agent never acts and the whole chain shows (tests/test_script_catch_chains.py).
"""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--case", choices=("isend", "fed", "unfed"), required=True)
    ap.add_argument("--catch", action="store_true")
    args = ap.parse_args()
    case = args.case
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    g = dist.new_group(timeout=datetime.timedelta(seconds=5))
    dist.barrier(group=g)  # every rank has connected the group: a peer's exit cannot meet a rank still connecting
    t = torch.full((2,), float(rank))
    try:
        if case == "isend":
            if rank == 0:
                w1, w2 = dist.isend(t, 1, group=g), dist.isend(t, 2, group=g)
                w2.wait()
                print("[0] send to 2 done", flush=True)
                w1.wait()
            elif rank == 2:
                time.sleep(0.5)
                dist.recv(t, 0, group=g)
        else:
            if rank == 1 and case == "unfed":
                os._exit(0)  # its sockets close as it calls this: no teardown to wait for
            if rank == 2:
                time.sleep(0.5 if case == "fed" else 0.8)  # unfed: well after rank 1's exit failed the root
            dist.broadcast(t, src=0, group=g)
        print(f"[{rank}] done {t.tolist()}", flush=True)
    except RuntimeError as e:
        print(f"[{rank}] {'timed out' if 'Timed out' in str(e) else 'peer gone'}", flush=True)
        if not args.catch:
            raise


if __name__ == "__main__":
    main()
