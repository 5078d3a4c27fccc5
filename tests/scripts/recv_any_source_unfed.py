"""A recv from any source (`dist.recv(t)` with no src, as `irecv`) that no rank feeds:
rank 0 leaves after a barrier and the last rank waits for a message from anyone, with a
tag another rank does send on. The wait ends by the Gloo timeout (an any-source receive
waits on no one pair, so no peer's exit fails it), and the Flight Recorder side names no
sender for it: the real side's notes had named the last rank itself (torch's source rank
of a failed receive is -1). Found by bench/script_sweep.py (seed 7 case 11, seed 10 cases 3
and 8). Started torchrun-style, any world size >= 2."""

import datetime
import os

import torch
import torch.distributed as dist


def main():
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2 + rank))
    world = dist.get_world_size()
    dist.barrier()
    if rank == 0:
        print("[0] leaving", flush=True)
        return
    if rank == world - 1:
        t = torch.zeros(2)
        src = dist.recv(t, tag=1)  # fed by rank 1 only when world > 2
        print(f"[{rank}] recv from {src}: {t.tolist()}", flush=True)
        dist.recv(t, tag=2)  # nobody sends with tag 2
    elif rank == 1:
        dist.send(torch.full((2,), 7.0), dst=world - 1, tag=1)
    print(f"[{rank}] done", flush=True)


if __name__ == "__main__":
    main()
