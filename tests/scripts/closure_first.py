"""Two Gloo deadlines in one group, within `deadlines.TIE_S`: rank 0's all_reduce (rank 1
never joins it; `init_process_group(timeout=A)`) and rank 1's receive from rank 0, entered
`D` seconds later. Two ranks.

    python closure_first.py A D   # torchrun-style, --nproc-per-node 2

Rank 0's timeout closes its pairs; when D is past the closure's latency (a few ms), rank 1's
receive ends with "Connection closed by peer" at once, not with its own timeout at A + D.
"""
import datetime
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=float(sys.argv[1])))
rank = dist.get_rank()
try:
    if rank == 0:
        dist.all_reduce(torch.ones(1))
    else:
        time.sleep(float(sys.argv[2]))
        dist.recv(torch.zeros(1), 0)
    print(rank, "ok")
except RuntimeError as e:
    print(rank, "raised", "timed out" if "Timed out waiting" in str(e) else "closed" if "closed" in str(e).lower() else e)
dist.destroy_process_group()
