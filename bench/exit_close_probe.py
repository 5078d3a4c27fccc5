"""When a rank that returns normally closes its Gloo pairs, as its peer sees it (2 ranks):
rank 1 returns right after an all-reduce; rank 0 recv()s from it and prints how long after
it posted the recv failed. Run it under real torchrun and on simdist's real side
(`python -m torch.distributed.run --standalone --nproc-per-node 2 bench/exit_close_probe.py`;
`simdist compare bench/exit_close_probe.py --nproc-per-node 2` prints the real side's line,
plain launch). docs/script-backend.md, "torchrun's agent" (the real side's exit, by launch).
"""
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
t = torch.ones(1)
dist.all_reduce(t)
if dist.get_rank() == 0:
    t0 = time.time()
    try:
        dist.recv(t, src=1)
    except RuntimeError:
        print("0 lost rank 1 after", round(time.time() - t0, 3), "s", flush=True)
