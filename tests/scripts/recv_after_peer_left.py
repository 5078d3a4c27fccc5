"""A receive posted after its peer's process is gone: rank 1 leaves after a barrier, rank 0
waits a second, then receives from it and then sends to it. Gloo refuses each at the call
(the pair is closed: "Connection closed by peer"), and both are operations all the same:
real Gloo's side had noted only p2p calls that returned a work, so its trace lacked them,
while one that the peer's exit fails at its wait was noted (sweep seed 2 case 4, a race
between the exit and the post). Each attempt prints the exception's type. 2 ranks."""

import time

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    dist.barrier()
    if rank == 1:
        print("[1] leaving", flush=True)
        return
    time.sleep(1.0)
    for name, fn in (("recv", lambda: dist.recv(torch.zeros(3), src=1)),
                     ("send", lambda: dist.send(torch.ones(3), dst=1))):
        try:
            fn()
            print(f"[0] {name}: ok", flush=True)
        except RuntimeError as e:
            print(f"[0] {name}: {type(e).__name__}", flush=True)


if __name__ == "__main__":
    main()
