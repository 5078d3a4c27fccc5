"""When real torchrun's agent SIGTERMs a peer after a worker's `raise` (2 ranks, under
`torchrun --nproc-per-node 2`; `bench/torchrun_teardown_tally.sh` runs it many times).

Rank 1 raises after an all-reduce, printing the wall time first. Rank 0 watches rank 1's
process end (a pidfd), rank 1's sockets close (an irecv from it fails then: when its peers
lose it), and catches the agent's SIGTERM in a sleep, then prints one line:
`PROBE {"lost": t, "exit": t, "term": t}` (wall times; the tally subtracts the raise's).
With the argument `os_exit`, rank 1 fails by `os._exit(1)` instead (no traceback, no
interpreter teardown: what a failure with no teardown gives, as a rank killed by a signal);
with `abort`, by `os.abort()` (SIGABRT, as Gloo's I/O thread's throw ends a rank: `lost` minus
`exit` is then how long a peer takes to see the loss, against `term` minus `exit`, the agent's).
docs/script-backend.md, "torchrun's agent"; simdist/script/agent.py's band.
"""

import json
import os
import select
import signal
import sys
import threading
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank = dist.get_rank()
pids = [torch.zeros(1, dtype=torch.int64) for _ in range(2)]
dist.all_gather(pids, torch.tensor([os.getpid()]))
t = torch.ones(2)
dist.all_reduce(t)
if rank == 1:
    print(f"RAISE {time.time():.6f}", flush=True)
    if sys.argv[1:] == ["os_exit"]:
        os._exit(1)
    if sys.argv[1:] == ["abort"]:
        os.abort()
    raise RuntimeError("boom")
marks: dict[str, float] = {}


def watch(pid: int) -> None:
    select.select([os.pidfd_open(pid)], [], [])  # readable once the process has ended
    marks["exit"] = time.time()


def lost(work) -> None:
    try:
        work.wait()
    except RuntimeError:
        marks["lost"] = time.time()


def term(sig, frame) -> None:
    marks["term"] = time.time()
    print("PROBE " + json.dumps(marks), flush=True)
    os._exit(143)


threading.Thread(target=watch, args=(int(pids[1].item()),), daemon=True).start()
threading.Thread(target=lost, args=(dist.irecv(torch.zeros(1), src=1),), daemon=True).start()
signal.signal(signal.SIGTERM, term)
time.sleep(8)
print("PROBE " + json.dumps(marks) + " nosigterm", flush=True)
