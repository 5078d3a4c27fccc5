"""A metrics thread all-reduces a loss on its own Gloo group every other step while the main
thread trains with DDP on the default group (3 ranks). Every rank completes with the same
values on both sides, but the order of the two threads' collectives in a rank's trace is the
host's scheduling: real runs differ among themselves (docs/script-backend.md, seventh batch:
`python bench/race_tally.py tests/scripts/thread_group_interleave.py --nproc 3 --n 8`)."""
import queue
import threading

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def metrics_worker(group, q, out):
    while True:
        item = q.get()
        if item is None:
            return
        step, loss = item
        t = torch.tensor([loss, 1.0], dtype=torch.float64)
        dist.all_reduce(t, group=group)
        out.append((step, t[0].item() / t[1].item()))


def main():
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    metrics_group = dist.new_group(backend="gloo")
    q, out = queue.Queue(), []
    th = threading.Thread(target=metrics_worker, args=(metrics_group, q, out))
    th.start()
    torch.manual_seed(0)
    model = DDP(torch.nn.Linear(4, 1))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(6):
        x = torch.randn(8, 4, generator=g)
        loss = F.mse_loss(model(x), x[:, :1])
        opt.zero_grad()
        loss.backward()
        opt.step()
        if step % 2 == 1:
            q.put((step, loss.item()))
    q.put(None)
    th.join()
    for step, mean in out:
        print(f"rank {rank}: step {step} mean loss {mean:.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
