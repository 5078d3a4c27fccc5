"""The last rank of a torchrun-style world is late for `init_process_group`: on real Gloo
every rank's init returns only once the whole world has joined (the store rendezvous, then
Gloo's full-mesh connect), and ends with the store's error after the init's `timeout=`.

    python init_waits_for_world.py MODE [TIMEOUT_S]

MODE: `exits` (the last rank exits before init), `subexits` (it runs a child interpreter,
which inherits its environment, then exits before init), `raises` (it raises before init),
`sleeps<S>` (it sleeps S seconds first, `sleeps1`), `computes<S>` (it computes S seconds
first: busy, not asleep; a rank whose init raises says whether that was well before the last
rank came, at its own timeout, or only about when it came), `joins` (no rank is late).
TIMEOUT_S: init_process_group's timeout (default: torch's, 30 min for Gloo). `--catch`: a rank
whose init raises prints what it raised and exits 0 (no process fails, so torchrun's agent never
acts and the late rank's own init shows: tests/test_script_catch_chains.py).
"""
import datetime
import os
import subprocess
import sys
import time

import torch
import torch.distributed as dist

argv, catch = [a for a in sys.argv if a != "--catch"], "--catch" in sys.argv
mode = argv[1]
timeout = {"timeout": datetime.timedelta(seconds=float(argv[2]))} if len(argv) > 2 else {}
rank, last = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"]) - 1
if rank == last:
    if mode in ("exits", "subexits"):
        if mode == "subexits":  # the child's own exit must not speak for this rank
            subprocess.run([sys.executable, "-c", "pass"], check=True)
        sys.exit(0)
    if mode == "raises":
        raise RuntimeError("the last rank fails before init")
    if mode.startswith("sleeps"):
        time.sleep(float(mode.removeprefix("sleeps")))
    if mode.startswith("computes"):
        end, x = time.monotonic() + float(mode.removeprefix("computes")), torch.ones(64, 64)
        while time.monotonic() < end:
            x = torch.tanh(x @ x)
entered = time.monotonic()
try:
    dist.init_process_group("gloo", **timeout)
except Exception as e:
    if mode.startswith("computes") and rank != last:  # (halfway between the timeout and the late arrival)
        early = time.monotonic() - entered < (float(mode.removeprefix("computes")) + float(argv[2])) / 2
        print(rank, "raised", "before the last rank came" if early else "once the last rank came", flush=True)
    if not catch:
        raise
    print(rank, "init raised", type(e).__name__, "(store timeout)" if "wait timeout" in str(e) else
          "(connectFullMesh)" if "connectFullMesh failed" in str(e) else str(e).splitlines()[0], flush=True)
    sys.exit(0)
t = torch.ones(1)
dist.all_reduce(t)
print(rank, "done", t.item(), flush=True)
dist.destroy_process_group()
