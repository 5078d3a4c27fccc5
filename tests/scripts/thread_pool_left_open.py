"""A script that leaves an idle ThreadPoolExecutor running when it ends, as torch.compile's
inductor does with its compile pool, and as scripts do that never call `shutdown()`: the
interpreter's exit wakes the idle workers (`concurrent.futures`' exit hook, registered with
`threading._register_atexit`) before it joins the threads, so the process ends. Each rank
prints what the pool computed and an all-reduced sum. Started torchrun-style."""

from concurrent.futures import ThreadPoolExecutor

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    pool = ThreadPoolExecutor(max_workers=2)
    squares = list(pool.map(lambda i: i * i, range(4)))
    total = torch.tensor([float(sum(squares) + rank)])
    dist.all_reduce(total)
    print(f"[rank{rank}] squares {squares} total {total.item()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
