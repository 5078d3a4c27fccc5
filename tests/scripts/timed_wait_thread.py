"""Uneven inputs with a side thread in a timed wait, as a progress bar's (tqdm's monitor loops
on `Event.wait(10)`, rich's refresh thread on `Event.wait(1/refresh)`): rank 1 does one fewer
all_reduce than rank 0 (rank r does 3 - r) and then waits for a message from rank 0 (as a rank that ran out of
inputs waits in its next collective), so neither rank's last wait can complete. Meanwhile a thread of each rank
loops on `threading.Event().wait(INTERVAL)` and never posts (standard library only).

Args: INTERVAL (the side thread's wait, s; 0: no side thread) and TIMEOUT (init's
`timeout=` in s; 0: torch's default, 30 min). With a TIMEOUT, real Gloo ends rank 0's wait
with its timeout error; without one, the run hangs."""
import datetime
import sys
import threading

import torch
import torch.distributed as dist

interval, timeout = float(sys.argv[1]), float(sys.argv[2])
kwargs = {"timeout": datetime.timedelta(seconds=timeout)} if timeout > 0 else {}
dist.init_process_group("gloo", **kwargs)
rank = dist.get_rank()
stop = threading.Event()


def monitor() -> None:
    while not stop.wait(interval):
        pass


if interval > 0:
    threading.Thread(target=monitor, daemon=True).start()
t = torch.ones(2)
for step in range(3 - rank):
    dist.all_reduce(t)
    print(rank, "step", step, t.tolist(), flush=True)
if rank > 0:
    dist.recv(t, src=0)
stop.set()
dist.destroy_process_group()
