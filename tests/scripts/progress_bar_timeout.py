"""A progress bar's monitor thread on every rank while the ranks hang, until Gloo's timeout ends them.

The thread loops as tqdm's monitor (`tqdm._monitor.TMonitor.run`) does: `Event.wait(INTERVAL)`,
then it reads `time.time()`; it never posts (standard library only). Rank 0 waits in an
all_reduce on WORLD that the others never join, each other rank in a recv from rank 0 on a
group of all ranks, to which rank 0 never sends: on real Gloo each raises "Timed out waiting
<T>ms for recv operation to complete" after TIMEOUT s (init's and the group's `timeout=`; 0:
torch's default, 30 min), each on its own (a timeout closes its rank's pairs of that group
only, so no wait meets another's closure, however far apart the ranks enter them: with both
waits on WORLD, a rank entering its recv a few ms after rank 0's all_reduce met rank 0's
closure instead, "Connection closed by peer", on a loaded host). Each rank catches the error
and prints it (less Gloo's source-file prefix), how long its wait lasted by each of its
clocks (time.monotonic, time.time, time.perf_counter; whole seconds) and whether the monitor
woke as often as its timer says and read that time pass. The other ranks then return after
0.5 s (their pairs stay open until rank 0 has timed out, on real Gloo as in the simulator,
which models no process teardown), rank 0 raises the error again after 1.5 s (once the others
have exited 0: torchrun's agent has no one left to end).

KIND "sleep": the thread is a heartbeat instead, `while True: time.sleep(INTERVAL)` (left
running, not joined: a daemon heartbeat is never stopped).

Args: INTERVAL (0: no monitor thread) TIMEOUT [KIND: event (default) | sleep].
"""
import datetime
import sys
import threading
import time

import torch
import torch.distributed as dist

interval, timeout = float(sys.argv[1]), float(sys.argv[2])
kind = sys.argv[3] if len(sys.argv) > 3 else "event"
kwargs = {"timeout": datetime.timedelta(seconds=timeout)} if timeout > 0 else {}
dist.init_process_group("gloo", **kwargs)
rank = dist.get_rank()
side = dist.new_group(list(range(dist.get_world_size())), **kwargs)
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


def heartbeat() -> None:
    while True:
        time.sleep(interval)
        seen["wakes"] += 1
        seen["last"] = time.time()


thread = threading.Thread(target=heartbeat if kind == "sleep" else monitor, daemon=True)
if interval > 0:
    thread.start()
t = torch.ones(2)
dist.all_reduce(t)
print(rank, "step", t.tolist(), flush=True)
t0, w0, p0 = time.monotonic(), time.time(), time.perf_counter()
try:
    dist.all_reduce(t) if rank == 0 else dist.recv(t, src=0, group=side)
except RuntimeError as e:
    took = [round(time.monotonic() - t0), round(time.time() - w0), round(time.perf_counter() - p0)]
    stop.set()
    if interval > 0 and kind != "sleep":
        thread.join()
    print(rank, "raised after", took, "s:", str(e).splitlines()[0].split("] ")[-1], flush=True)
    print(rank, "monitor woke as its timer says:", seen["wakes"] >= (limit / interval - 2 if interval > 0 else 0),
          "and read the time pass:", seen["last"] - w0 >= limit - 2 * interval - 1, flush=True)
    time.sleep(0.5 if rank else 1.5)
    if rank == 0:
        raise
