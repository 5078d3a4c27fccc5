"""How long a Gloo timeout, and what comes after it, lasted by each rank's clocks.

Rank `who` waits in a recv from the other of ranks 0 and 1 on their group (TIMEOUT s), which
never sends; every other rank but rank 0 waits for a store key that rank 0 sets. MODE stuck
(`who` 0): rank 0 times out, then sets the key, so the others wait TIMEOUT s too: the
simulator ends the timeout at once (every rank blocked), and every rank's clocks must move on
by it, not only rank 0's. MODE sleep (`who` 1): rank 0 sleeps SLEEP s, then sets the key, so
rank 1's timeout ends while rank 0 sleeps, and rank 1's clocks must not count again, once it
has the key, the wall time it already skipped. Each rank prints how long its wait lasted
(the one that timed out) and how long it took to the key, by time.time, time.monotonic and
time.perf_counter and datetime.now (read in C: `rank.simclock` moves it too), whole seconds. With
MONITOR > 0, a thread of rank 0 loops on `Event.wait(MONITOR)` meanwhile, as tqdm's monitor
does: the simulator wakes it in simulated time (`simdist.script.timedwakes`), which must move
every rank's clocks, not only rank 0's.

Args: MODE TIMEOUT SLEEP [MONITOR].
"""
import datetime
import sys
import threading
import time

import torch
import torch.distributed as dist

mode, timeout, sleep = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
interval = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
dist.init_process_group("gloo")
rank = dist.get_rank()
group = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=timeout))
store = dist.distributed_c10d._get_default_store()
who = 0 if mode == "stuck" else 1
dist.barrier()
start = time.time(), time.monotonic(), time.perf_counter(), datetime.datetime.now()


def took() -> list[int]:
    now = time.time(), time.monotonic(), time.perf_counter(), datetime.datetime.now()
    return [round(b - a) for a, b in zip(start[:3], now[:3], strict=True)] + [round((now[3] - start[3]).total_seconds())]


stop = threading.Event()
if rank == 0 and interval > 0:
    threading.Thread(target=lambda: [None for _ in iter(lambda: stop.wait(interval), True)], daemon=True).start()
if rank == who:
    try:
        dist.recv(torch.ones(1), src=1 - rank, group=group)
    except RuntimeError as e:
        print(rank, "timed out after", took(), str(e).splitlines()[0].split("] ")[-1], flush=True)
if rank == 0:
    time.sleep(sleep if mode == "sleep" else 0)
    stop.set()
    store.set("go", "1")
else:
    store.get("go")
print(rank, "had the key after", took(), flush=True)
