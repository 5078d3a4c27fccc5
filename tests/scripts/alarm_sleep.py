"""A sleep a signal cuts short: rank 1 sets `signal.alarm(1)` whose handler raises, then sleeps
SECONDS; the handler's exception ends the sleep at 1 s and rank 1 joins the all_reduce rank 0
waits in with the world's Gloo timeout of LIMIT seconds. Real Gloo: with LIMIT 3 and SECONDS 5
the all_reduce completes (rank 1 is 1 s late, not 5); HOW `returns`: the handler returns, the
sleep goes on to its end, and rank 0's all_reduce times out.

    torchrun --nproc-per-node 2 alarm_sleep.py HOW SECONDS LIMIT
"""
import datetime
import signal
import sys
import time

import torch
import torch.distributed as dist

how, seconds, limit = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=limit))
rank = dist.get_rank()


class Alarm(Exception):
    pass


def handler(signum, frame):
    if how == "raises":
        raise Alarm


dist.barrier()
if rank == 1:
    signal.signal(signal.SIGALRM, handler)
    signal.alarm(1)
    t0 = time.monotonic()
    try:
        time.sleep(seconds)
        print(rank, "slept", round(time.monotonic() - t0), flush=True)
    except Alarm:
        print(rank, "cut at", round(time.monotonic() - t0), flush=True)
t = torch.ones(2)
try:
    dist.all_reduce(t)
    print(rank, "all_reduce", t.tolist(), flush=True)
except RuntimeError as e:
    print(rank, "raised", type(e).__name__, flush=True)
