"""Rank 1 polls with `time.sleep(0.1)` for a file that rank 0's child process writes after 2 s,
while rank 0 waits in a barrier with a group timeout of TIMEOUT s (argv[1]). On real Gloo rank 1
sees the file after about 2 s and the barrier completes. A simulator that ran rank 1's sleeps
forward in simulated time (every rank blocked but for a sleeping thread) skipped rank 1's clocks
ahead of the child's wall-clock progress and fired rank 0's timeout."""
import os
import shutil
import subprocess
import sys
import tempfile
import time
from datetime import timedelta

import torch.distributed as dist

dist.init_process_group("gloo", timeout=timedelta(seconds=float(sys.argv[1])))
rank = dist.get_rank()
where = [tempfile.mkdtemp() if rank == 0 else None]
dist.broadcast_object_list(where, src=0)
flag = os.path.join(where[0], "ready")
if rank == 0:
    child = subprocess.Popen(["sh", "-c", f"sleep 2; touch {flag}"])
else:
    t0 = time.monotonic()
    while not os.path.exists(flag):
        time.sleep(0.1)
    print(f"rank 1 saw the file; its clock read under a minute: {time.monotonic() - t0 < 60}")
dist.barrier()
if rank == 0:
    child.wait()
    shutil.rmtree(where[0])
print(f"rank {rank} done")
dist.destroy_process_group()
