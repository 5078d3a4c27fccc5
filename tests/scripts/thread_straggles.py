"""A side thread that sleeps, then joins a collective, makes its rank late for it: rank 1's
background thread sleeps SECONDS and then calls HOW (`all_reduce`, or `send` to rank 0), while
rank 0 waits in it with the world's Gloo timeout of LIMIT seconds (and rank 1's main thread
waits for its thread). On real Gloo rank 0's wait times out when LIMIT < SECONDS (its error
line is printed), then rank 1's call meets its closed pair; with LIMIT > SECONDS it completes.

    torchrun --nproc-per-node 2 thread_straggles.py HOW SECONDS LIMIT
"""
import datetime
import sys
import threading
import time

import torch
import torch.distributed as dist

how, seconds, limit = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=limit))
rank = dist.get_rank()
t = torch.ones(2)


def call():
    if how == "all_reduce":
        dist.all_reduce(t)
    elif rank == 1:
        dist.send(t, dst=0)
    else:
        dist.recv(t, src=1)


def later():
    time.sleep(seconds)
    try:
        call()
        print(rank, "thread's call completed", t.tolist(), flush=True)
    except RuntimeError as e:
        print(rank, "thread's call raised", type(e).__name__, flush=True)


dist.barrier()
if rank == 1:
    helper = threading.Thread(target=later)
    helper.start()
    helper.join()
else:
    try:
        call()
        print(rank, "completed", t.tolist(), flush=True)
    except RuntimeError as e:
        print(rank, "raised", str(e).splitlines()[0].split("] ", 1)[-1], flush=True)  # (without Gloo's source path)
