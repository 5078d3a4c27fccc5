"""A progress bar's monitor thread on every rank while the ranks hang, until Gloo's timeout ends them.

The thread loops as tqdm's monitor (`tqdm._monitor.TMonitor.run`) does: `Event.wait(INTERVAL)`,
then it reads `time.time()`; it never posts (standard library only). Rank 0 does one all_reduce
more than rank 1, which waits in a recv from rank 0 meanwhile: neither wait can complete, and on
real Gloo both raise "Timed out waiting <T>ms for recv operation to complete" after TIMEOUT s
(init's `timeout=`; 0: torch's default, 30 min). Each rank catches the error and prints it (less
Gloo's source-file prefix), how long its wait lasted by each of its clocks (time.monotonic,
time.time, time.perf_counter; whole seconds) and whether the monitor woke as often as its timer
says and read that time pass; then it raises it again.

Args: INTERVAL (0: no monitor thread) TIMEOUT.
"""
import datetime
import sys
import threading
import time

import torch
import torch.distributed as dist

interval, timeout = float(sys.argv[1]), float(sys.argv[2])
kwargs = {"timeout": datetime.timedelta(seconds=timeout)} if timeout > 0 else {}
dist.init_process_group("gloo", **kwargs)
rank = dist.get_rank()
limit = timeout or 1800.0  # torch's default for Gloo
stop = threading.Event()
seen = {"wakes": 0, "last": 0.0}


def monitor() -> None:  # tqdm's TMonitor.run, less the bars it refreshes
    while True:
        stop.wait(interval)
        if stop.is_set():
            return
        seen["wakes"] += 1
        seen["last"] = time.time()


thread = threading.Thread(target=monitor, daemon=True)
if interval > 0:
    thread.start()
t = torch.ones(2)
dist.all_reduce(t)
print(rank, "step", t.tolist(), flush=True)
t0, w0, p0 = time.monotonic(), time.time(), time.perf_counter()
try:
    if rank == 0:
        dist.all_reduce(t)
    else:
        dist.recv(t, src=0)
except RuntimeError as e:
    took = [round(time.monotonic() - t0), round(time.time() - w0), round(time.perf_counter() - p0)]
    stop.set()
    if interval > 0:
        thread.join()
    print(rank, "raised after", took, "s:", str(e).splitlines()[0].split("] ")[-1], flush=True)
    print(rank, "monitor woke as its timer says:", seen["wakes"] >= limit / interval - 2,
          "and read the time pass:", seen["last"] - w0 >= limit - 2 * interval - 1, flush=True)
    raise
