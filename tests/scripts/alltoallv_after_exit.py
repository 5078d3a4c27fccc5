"""all_to_all_single with split sizes (Gloo's alltoallv) that the last rank calls once more
than its peers, which leave: its messages to them fail it with "Connection closed by peer",
at once, as alltoall's do (Gloo posts every send and receive, then waits). The simulator
did not model alltoallv's messages and let the rank wait for its Gloo timeout.
`--when late`: the last rank posts after its peers are gone; `early`: it posts first and
the peers leave 0.5 s later. Found by bench/script_sweep.py (seed 7 case 8, where the
rank posts while its peers tear down: then real Gloo may also leave a send to a dying peer
queued until the timeout, a race of the real run). Started torchrun-style, any world >= 2."""

import argparse
import datetime
import os
import time

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--when", choices=["early", "late"], default="late")
    args = ap.parse_args()
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=3 + rank))
    world = dist.get_world_size()
    splits = [(rank + k) % 3 + 1 for k in range(world)]  # rank r sends (r + k) % 3 + 1 to rank k
    for step in range(2 if rank == world - 1 else 1):
        if step == 1 and args.when == "late":
            time.sleep(1.0)
        x = torch.arange(sum(splits)) + 10 * rank
        y = torch.zeros_like(x)
        dist.all_to_all_single(y, x, splits, splits)
        print(f"[{rank}] step {step} {y.tolist()}", flush=True)
    if args.when == "early":
        time.sleep(0.5)
    print(f"[{rank}] leaving", flush=True)


if __name__ == "__main__":
    main()
