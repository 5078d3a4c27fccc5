"""How long a wait at the c10d store that timed out lasted, by each rank's clocks.

MODE group: rank 1 calls `new_group([0, 1], timeout=T)`, which rank 0 never calls (it waits
in a recv from rank 1 meanwhile): rank 1 raises the store's error after T s, then sends to
rank 0. MODE init: rank 1's process ends before its init; rank 0's `init_process_group(
timeout=T)` raises the store's error after T s. Each rank prints how long its wait lasted by
time.monotonic, time.time, time.perf_counter and datetime.now (whole seconds). The simulator
ends such a wait at once where every rank is blocked, skipping simulated time: the clocks
must read the T s as real Gloo's do (`scriptclocks`).

Args: MODE T.
"""
import datetime
import os
import sys
import time

import torch
import torch.distributed as dist

mode, limit = sys.argv[1], float(sys.argv[2])


def clocks() -> tuple:
    return time.monotonic(), time.time(), time.perf_counter(), datetime.datetime.now()


def took(start: tuple) -> list[int]:
    now = clocks()
    return [round(b - a) for a, b in zip(start[:3], now[:3], strict=True)] + [round((now[3] - start[3]).total_seconds())]


def words(e: Exception) -> str:
    return f"{type(e).__name__}: {str(e).splitlines()[0][:60]}"


if mode == "init":
    if os.environ["RANK"] == "1":
        sys.exit(0)
    start = clocks()
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=limit))
    except Exception as e:  # noqa: BLE001 - torch's store error, printed
        print(0, "init raised after", took(start), words(e), flush=True)
    sys.exit(0)
dist.init_process_group("gloo")
rank = dist.get_rank()
dist.barrier()
start = clocks()
t = torch.zeros(1)
if rank == 1:
    try:
        dist.new_group([0, 1], timeout=datetime.timedelta(seconds=limit))
    except Exception as e:  # noqa: BLE001 - torch's store error, printed
        print(1, "new_group raised after", took(start), words(e), flush=True)
    dist.send(torch.ones(1), dst=0)
else:
    dist.recv(t, src=1)
    print(0, "recv", t.tolist(), "after", took(start), flush=True)
