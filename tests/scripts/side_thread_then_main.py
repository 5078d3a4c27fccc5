"""A side thread runs one collective, then the main thread runs collectives with no compute
between them. Before init the main thread computes `BUSY_S` of CPU, which is no simulated
time (init's message marks where the rank's compute starts): that CPU must not come back as
compute at the main thread's next message after the side thread's.

    (no argument)  as above
    reuse          a second side thread, started once the first ended (CPython hands it the
                   first's `threading.get_ident()`), computes `BUSY_S` before its collective:
                   a new thread's first message only sets its mark, so that is no compute
                   either, not `BUSY_S` less the first thread's CPU
Any world size >= 2."""

import sys
import threading
import time

import torch
import torch.distributed as dist

BUSY_S = 0.5


def busy(seconds: float) -> None:
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def busy_then_all_reduce(t: torch.Tensor) -> None:
    busy(BUSY_S)
    dist.all_reduce(t)


def main():
    reuse = sys.argv[1:] == ["reuse"]
    busy(BUSY_S)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    side = torch.tensor([float(rank + 1)])
    t = threading.Thread(target=dist.all_reduce, args=(side,))
    t.start()
    t.join()
    if reuse:
        t = threading.Thread(target=busy_then_all_reduce, args=(side,))
        t.start()
        t.join()
    sums = []
    for i in range(3):
        x = torch.tensor([float(rank + i)])
        dist.all_reduce(x)
        sums.append(x.item())
    print(f"rank {rank}: side {side.item()} main {sums}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
