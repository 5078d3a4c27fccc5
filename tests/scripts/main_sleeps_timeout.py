"""Rank 0's main thread sleeps while the others wait for it: a straggler, then a poll loop.

First rank 0 sleeps STRAGGLE s before an all_reduce the others wait in: each rank prints how
long its all_reduce took by its clocks. Then rank 0's main thread loops on
`time.sleep(INTERVAL)` until TIMEOUT + 1 s have passed by its clock (a poll for a flag no one
sets), while every other rank waits in a recv from rank 0 on a group of all ranks, which ends
with Gloo's timeout error after TIMEOUT s (init's and the group's `timeout=`; 0: torch's
default, 30 min). Each rank prints how long its wait lasted, by time.monotonic, time.time,
time.perf_counter and datetime.now (whole seconds), and whether its calendar clocks
(`datetime.now`, `time.localtime`, `time.strftime`, ...: read in C) agree with time.time.
With SPIN > 0, rank 1 computes SPIN s of CPU time between reading its clocks and its recv: the
wall time of a rank running between operations (as a process descheduled on a loaded host),
which its blocked peers' clocks must not count (rank 2's recv still times out after TIMEOUT s).

Args: STRAGGLE INTERVAL TIMEOUT [SPIN].
"""
import calendar
import datetime
import sys
import time

import torch
import torch.distributed as dist

straggle, interval, timeout = float(sys.argv[1]), float(sys.argv[2]), float(sys.argv[3])
spin = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
kwargs = {"timeout": datetime.timedelta(seconds=timeout)} if timeout > 0 else {}
dist.init_process_group("gloo", **kwargs)
rank = dist.get_rank()
side = dist.new_group(list(range(dist.get_world_size())), **kwargs)
limit = timeout or 1800.0  # torch's default for Gloo
dist.barrier()


def clocks() -> tuple:
    return time.monotonic(), time.time(), time.perf_counter(), datetime.datetime.now()


def took(start: tuple) -> list[int]:
    now = clocks()
    return [round(b - a) for a, b in zip(start[:3], now[:3], strict=True)] + [round((now[3] - start[3]).total_seconds())]


def calendar_agrees() -> list[bool]:
    """Each calendar clock read with no time given, against time.time (within 1.5 s: whole seconds)."""
    fmt = "%Y-%m-%d %H:%M:%S"
    t = time.time()
    reads = [datetime.datetime.now().timestamp(), datetime.datetime.now(datetime.timezone.utc).timestamp(),
             calendar.timegm(datetime.datetime.utcnow().timetuple()), datetime.datetime.today().timestamp(),
             time.mktime(time.localtime()), calendar.timegm(time.gmtime()),
             time.mktime(time.strptime(time.strftime(fmt), fmt)), time.mktime(time.strptime(time.ctime())),
             time.mktime(time.strptime(time.asctime()))]
    return [abs(r - t) < 1.5 for r in reads]


start = clocks()
if rank == 0:
    time.sleep(straggle)
t = torch.ones(1)
dist.all_reduce(t)
print(rank, "all_reduce after", took(start), flush=True)
start = clocks()
if rank == 0:
    while time.monotonic() - start[0] < limit + 1:  # a flag no one sets
        time.sleep(interval)
    print(0, "stopped polling after", took(start), flush=True)
else:
    cpu = time.thread_time()
    while rank == 1 and time.thread_time() - cpu < spin:  # compute: none under --zero-compute
        pass
    try:
        dist.recv(t, src=0, group=side)
    except RuntimeError as e:
        print(rank, "raised after", took(start), str(e).splitlines()[0].split("] ")[-1], flush=True)
print(rank, "calendar clocks read time.time:", calendar_agrees(), flush=True)
