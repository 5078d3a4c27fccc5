#!/usr/bin/env python
"""Real Gloo, plain torchrun: when a rank's own Gloo timeout fires a little before its peers'
deadlines in the same group, do the peers time out on their own or meet its pair closure?
(docs/script-backend.md, "Races of the real run": the tie race.)

The shape of `tests/scripts/rank_failures.py --case mismatch`: 3 ranks all_reduce; at step 1
rank 1 all-reduces 5 floats where the others give 4, so it waits for a message never sent,
while ranks 0 and 2 complete step 1 (Gloo's ring pairs the bytes) and block in step 2, which
rank 1 never joins. Rank 1's deadline is its step-1 post plus the timeout; the others' their
step-2 post plus the timeout: later by what they did in between (the end of step 1, a print,
a few tensor ops), which the host's load stretches. Each worker notes `time.monotonic()` (one
clock for every process of the host) at each post and at its failure, with what it failed
with, into a JSON file of its own; the driver prints one line a run: the load, each
rank's deadline after rank 1's (its post's gap), and how ranks 0 and 2 failed and when after
rank 1's timeout.

    python bench/tie_closure_probe.py RUNS [--timeout 3] [--linger 0] [--delay 0]

`--delay S`: ranks 0 and 2 sleep S seconds before their step-2 post: their deadline that much
later than rank 1's (the band in which either outcome happens).

`--linger S`: rank 1 sleeps S seconds after its timeout before raising (its process, and so
its sockets, live on): a peer that still fails with the closure within milliseconds of rank
1's timeout met the closure of the timeout itself (Gloo's `signalException` on the rank's
pairs), not of the process's end.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def worker(timeout_s: float, linger_s: float, into: Path, delay_s: float) -> None:
    import torch
    import torch.distributed as dist

    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=timeout_s))
    rank = dist.get_rank()
    noted: dict[str, object] = {"rank": rank}
    w = torch.ones(4)
    try:
        for step in range(3):
            if step == 2 and delay_s:
                time.sleep(delay_s)  # ranks 0 and 2: their deadline that much later
            g = torch.zeros(5) if rank == 1 and step == 1 else torch.full((4,), float(rank + step))
            noted[f"post{step}"] = time.monotonic()
            dist.all_reduce(g)
            noted[f"done{step}"] = time.monotonic()
            print(f"rank {rank} step {step}: {g.tolist()}", flush=True)
            w -= 0.1 * g[:4]
    except RuntimeError as e:
        noted["fail"] = time.monotonic()
        text = str(e)
        noted["how"] = "timeout" if "Timed out" in text else "closed" if "by peer" in text else text[:80]
        (into / f"{rank}.json").write_text(json.dumps(noted))
        if rank == 1 and linger_s:
            time.sleep(linger_s)
        raise
    (into / f"{rank}.json").write_text(json.dumps(noted))
    dist.destroy_process_group()


def one_run(timeout_s: float, linger_s: float, delay_s: float) -> str:
    load = Path("/proc/loadavg").read_text().split()[0]
    with tempfile.TemporaryDirectory() as into:
        subprocess.run([sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node", "3",
                        __file__, "--worker", "--timeout", str(timeout_s), "--linger", str(linger_s), "--into", into,
                        "--delay", str(delay_s)],
                       capture_output=True, text=True, timeout=120, cwd="/tmp")
        ranks = {int(p.stem): json.loads(p.read_text()) for p in Path(into).glob("*.json")}
    if 1 not in ranks or "fail" not in ranks[1]:
        return f"load {load}: no line of rank 1 ({sorted(ranks)})"
    one = ranks[1]
    parts = [f"load {load}", f"rank 1 {one['how']}"]
    for r in (0, 2):
        m = ranks.get(r)
        if m is None or "fail" not in m:
            parts.append(f"rank {r} ?")
            continue
        gap = m["post2"] - one["post1"]  # its deadline after rank 1's
        between = m["post2"] - m["done1"]  # what it did between step 1's return and step 2's post
        parts.append(f"rank {r} deadline +{gap * 1000:.1f} ms (step 1 to 2: {between * 1000:.1f} ms), "
                     f"{m['how']} at {(m['fail'] - one['fail']) * 1000:+.1f} ms")
    return " | ".join(parts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("runs", type=int, nargs="?", default=10)
    ap.add_argument("--timeout", type=float, default=3.0)
    ap.add_argument("--linger", type=float, default=0.0)
    ap.add_argument("--delay", type=float, default=0.0, help="ranks 0 and 2 sleep this long before step 2")
    ap.add_argument("--worker", action="store_true")
    ap.add_argument("--into", type=Path, help="(worker) the folder each rank writes its JSON to")
    a = ap.parse_args()
    if a.worker:
        worker(a.timeout, a.linger, a.into, a.delay)
        return 0
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    for _ in range(a.runs):
        print(one_run(a.timeout, a.linger, a.delay), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
