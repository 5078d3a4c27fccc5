"""What a GPU script prints of its GPU's memory: `torch.cuda.memory_allocated`,
`max_memory_allocated`, `memory_reserved`, `max_memory_reserved`, `memory_stats()` and
`mem_get_info` after known allocations, a frees, `empty_cache`, `reset_peak_memory_stats`,
and around a DDP training step (llm.c's train_gpt2.py prints "peak memory consumption" so).
Each rank prints what it saw. Started torchrun-style."""

import os

import torch
import torch.distributed as dist


def show(rank, key, value):
    print(f"[rank{rank}] {key}: {value}", flush=True)


def figures():
    stats = torch.cuda.memory_stats()
    return (torch.cuda.memory_allocated(), torch.cuda.max_memory_allocated(), torch.cuda.memory_reserved(),
            torch.cuda.max_memory_reserved(), stats["segment.all.current"], stats["num_alloc_retries"])


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    show(rank, "start", figures())
    a = torch.empty(1000, device="cuda")  # 4000 B: a 4096 B block of a 2 MiB segment
    show(rank, "small", figures())
    b = torch.empty(1000 * (rank + 1), device="cuda")
    del a
    show(rank, "freed one", figures())
    big = torch.empty(3_000_000, device="cuda")  # 12 MB: a 12 MiB segment of its own, not split
    show(rank, "big", (figures(), torch.cuda.memory_stats()["requested_bytes.all.current"]))
    del big
    torch.cuda.empty_cache()
    show(rank, "empty_cache", (figures(), torch.cuda.mem_get_info()))
    torch.cuda.reset_peak_memory_stats()
    model = torch.nn.Sequential(torch.nn.Linear(64, 256), torch.nn.ReLU(), torch.nn.Linear(256, 8)).cuda()
    ddp = torch.nn.parallel.DistributedDataParallel(model, device_ids=[local_rank])
    opt = torch.optim.AdamW(ddp.parameters(), lr=1e-3)
    show(rank, "model", figures())
    for _ in range(2):
        x = torch.randn(32, 64, device="cuda")
        loss = ddp(x).square().mean()
        loss.backward()
        opt.step()
        opt.zero_grad(set_to_none=True)
    show(rank, "trained", figures())
    print(f"[rank{rank}] peak memory consumption: {torch.cuda.max_memory_allocated() // 1024 // 1024} MiB", flush=True)
    show(rank, "other device", torch.cuda.memory_allocated((local_rank + 1) % 2))
    del b
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
