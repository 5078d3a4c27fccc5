"""A worker fails while its peer sleeps: torchrun's agent ends the sleeper by SIGTERM.

Rank 1 raises after the first all-reduce; rank 0 sleeps (argv[1] seconds, default 5) and
would then all-reduce again and print. Under torchrun (`--max-restarts 0`) rank 0 never gets
there: the agent polls every 0.1 s, sees rank 1's exit, SIGTERMs rank 0 in its sleep
(exit code -15). argv[2], how rank 1 fails: `raise` (default: a traceback and the
interpreter's teardown before its process ends), `os_exit` (`os._exit(1)`) or `sigkill` (it
SIGKILLs itself): no teardown, so the agent comes within a poll of the failure.
`tests/test_script_agent.py`; docs/script-backend.md, "torchrun's agent".
"""

import os
import signal
import sys
import time

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
r = dist.get_rank()
t = torch.ones(1)
dist.all_reduce(t)
if r == 1:
    how = sys.argv[2] if len(sys.argv) > 2 else "raise"
    if how == "os_exit":
        os._exit(1)
    if how == "sigkill":
        os.kill(os.getpid(), signal.SIGKILL)
    raise RuntimeError("boom")
time.sleep(float(sys.argv[1]) if len(sys.argv) > 1 else 5.0)
dist.all_reduce(t)
print(r, "done", flush=True)
