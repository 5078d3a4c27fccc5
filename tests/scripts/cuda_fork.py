"""CUDA across fork, as torch's own source says it goes (there is no GPU here to compare
with). A child forked after its parent initialised CUDA, or only asked
`torch.cuda.is_available()`, cannot initialise CUDA: its first CUDA use raises "Cannot
re-initialize CUDA in forked subprocess" (an `mp.Process` with the fork start method,
`os.fork`, DataLoader workers whose collate moves the batch to the GPU, a GPU tensor received
through a queue); a child forked before that, or started with spawn, uses its GPU; pinned
batches from workers are legal.
Each rank prints what each child got. Started torchrun-style."""

import multiprocessing as mp
import os

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, TensorDataset

USES = {
    "cuda": lambda: torch.ones(2).cuda().sum().item(),
    "factory": lambda: torch.zeros(2, device="cuda").sum().item(),
    "set_device": lambda: torch.cuda.set_device(0),
    "current_device": lambda: torch.cuda.current_device(),
    "queries": lambda: (torch.cuda.is_available(), torch.cuda.device_count() > 0, torch.cuda._is_in_bad_fork(),
                        torch._C._cuda_isInBadFork(), torch.cuda.is_initialized()),
}


def show(rank, key, value):
    print(f"[rank{rank}] {key}: {value}", flush=True)


def outcome(fn):
    try:
        return f"ok {fn()}"
    except Exception as e:  # what the child's use raised, as the parent would see it
        return f"{type(e).__name__}: {e}"


def child(queue, uses, inbox):
    got = [(use, outcome(USES[use])) for use in uses]
    if inbox is not None:
        got.append(("receive", outcome(lambda: inbox.get().device)))
    queue.put(got)


def in_child(method, uses, send=None):
    """What a child started with `method` got from each use (and from receiving `send`)."""
    ctx = mp.get_context(method)
    queue, inbox = ctx.Queue(), (None if send is None else ctx.Queue())
    proc = ctx.Process(target=child, args=(queue, uses, inbox))
    proc.start()
    if inbox is not None:
        inbox.put(send)
    got = queue.get()
    proc.join()
    return got


def in_os_fork(use):
    read, write = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.close(read)
        os.write(write, outcome(USES[use]).encode())
        os._exit(0)
    os.close(write)
    with os.fdopen(read, "rb") as f:
        got = f.read().decode()
    os.waitpid(pid, 0)
    return got


def to_gpu(batch):
    return torch.stack([b[0] for b in batch]).cuda()


def main():
    rank, local_rank = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    show(rank, "fork before CUDA", in_child("fork", ["cuda"]))
    torch.cuda.is_available()
    show(rank, "fork after is_available", in_child("fork", ["queries", "cuda"]))
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    x = torch.full((2,), float(rank + 1), device="cuda")
    show(rank, "fork after init", in_child("fork", list(USES), send=x))
    show(rank, "os.fork after init", in_os_fork("factory"))
    data = TensorDataset(torch.arange(8.0))
    try:
        for batch in DataLoader(data, batch_size=4, num_workers=2, collate_fn=to_gpu):
            show(rank, "collate to gpu", batch.tolist())
    except RuntimeError as e:
        lines = str(e).strip().splitlines()
        show(rank, "collate to gpu", f"RuntimeError: {lines[0]} ... {lines[-1]}")
    pinned = [(b.tolist(), b.cuda(non_blocking=True).sum().item())
              for (b,) in DataLoader(data, batch_size=4, num_workers=2, pin_memory=True)]
    show(rank, "pinned batches", pinned)
    show(rank, "spawn after init", in_child("spawn", ["cuda"], send=x))
    dist.all_reduce(x)
    show(rank, "all_reduce", x.tolist())
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
