"""A training loop under a real tqdm progress bar (its monitor thread, `TMonitor`, loops on
`Event.wait(10)`) hangs: rank 0's second all_reduce is never joined, the other ranks wait in a
recv from rank 0 on a group of all ranks (each wait times out on its own, as in
`progress_bar_timeout.py`). On real Gloo each wait ends after TIMEOUT s (init's and the group's
`timeout=`; 0: torch's default, 30 min) with "Timed out waiting <T>ms for recv operation to
complete". Each rank prints the error (less Gloo's source-file prefix) and how long its wait
lasted by time.monotonic (whole seconds); the others return after 0.5 s, rank 0 raises it again
after 1.5 s. Needs tqdm (not a dependency of simdist: `pip install tqdm`).

Args: TIMEOUT.
"""
import datetime
import sys
import time

import torch
import torch.distributed as dist
from tqdm import tqdm

timeout = float(sys.argv[1])
kwargs = {"timeout": datetime.timedelta(seconds=timeout)} if timeout > 0 else {}
dist.init_process_group("gloo", **kwargs)
rank = dist.get_rank()
side = dist.new_group(list(range(dist.get_world_size())), **kwargs)
t = torch.ones(2)
try:
    for step in tqdm(range(2), disable=rank != 0, mininterval=0, file=sys.stderr):
        t0 = time.monotonic()
        if rank == 0 or step == 0:
            dist.all_reduce(t)
        else:
            dist.recv(t, src=0, group=side)
        print(rank, "step", step, t.tolist(), flush=True)
except RuntimeError as e:
    print(rank, "raised after", round(time.monotonic() - t0), "s:", str(e).splitlines()[0].split("] ")[-1], flush=True)
    time.sleep(0.5 if rank else 1.5)
    if rank == 0:
        raise
