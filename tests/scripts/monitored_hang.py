"""Rank 0 waits in a barrier while the others wait in a monitored_barrier (torch's default
timeout: a hang). Its messages are Gloo's own, not the trace's: the report must say the
others wait in monitored_barrier, not in rank 0's barrier."""

import datetime

import torch.distributed as dist

dist.init_process_group("gloo")
if dist.get_rank() == 0:
    dist.barrier()
else:
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=1))
