"""A send whose receiver leaves (`python send_to_leaver.py BYTES posted|never|alive [exit|kill]`,
2 ranks): rank 0 sends BYTES (float32) to rank 1 with a 5 s Gloo timeout.

`posted`: rank 1 posts the receive (`irecv`) and leaves without waiting on it. `never`: it
leaves without posting one. `alive`: it never receives but stays up past rank 0's timeout.
`exit` (default): rank 1 leaves by `sys.exit(3)` (the interpreter unwinds); `kill`: by
`os._exit(3)` (its sockets close at once). Rank 0 posts its send first (before rank 1 does
anything: a broadcast orders them), so what decides is what Gloo's pair does with a send
whose receiver is gone: see `simdist.races` (the send band) and docs/script-backend.md."""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def main():
    nbytes, how = int(sys.argv[1]), sys.argv[2]
    leave = os._exit if len(sys.argv) > 3 and sys.argv[3] == "kill" else sys.exit
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=5))
    rank = dist.get_rank()
    t = torch.zeros(max(1, nbytes // 4))
    dist.broadcast(torch.zeros(1), src=0)
    if rank == 0:
        dist.send(t, dst=1)
        print("[0] sent", flush=True)
        return
    time.sleep(0.3)  # rank 0's send is posted (its "send ready" notice is here)
    if how == "posted":
        dist.irecv(t, src=0)
    elif how == "alive":
        time.sleep(8.0)
    print("[1] leaving", flush=True)
    leave(3)


if __name__ == "__main__":
    main()
