"""What a GPU script reads off its tensors' devices, and what it does with them: `x.device`,
`str(x.device)`, `.is_cuda`, `.is_cpu`, `.get_device()`, `.type()`, a model's
`next(model.parameters()).device`, factories and moves placed by a device read off a tensor
(`torch.zeros(n, device=x.device)`, `batch.to(x.device)`, `x.to(x.device) is x`), a
branch on `x.device.type`, a prefetcher's side-stream copy with `record_stream`, and what
torch's own code places on a device it reads off a GPU tensor (`clip_grad_norm_`'s norm),
an FSDP2 parameter's device (a DTensor), and a compiled function placing by `a.device`. Each rank prints what it saw. Started torchrun-style."""

import os

import torch
import torch.distributed as dist
from torch.distributed.fsdp import fully_shard


def show(rank, key, value):
    print(f"[rank{rank}] {key}: {value}", flush=True)


def main():
    local_rank = int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl")
    rank = dist.get_rank()
    x = torch.ones(3, device="cuda")
    show(rank, "device", (x.device, str(x.device), x.device.type, x.device.index))
    show(rank, "flags", (x.is_cuda, x.is_cpu, x.get_device(), x.type()))
    model = torch.nn.Linear(3, 1).to(f"cuda:{local_rank}")
    device = next(model.parameters()).device
    show(rank, "model device", device)
    made = torch.zeros(2, device=x.device)
    moved = torch.arange(2.0).to(device)
    show(rank, "placed by x.device", (repr(made), repr(moved), x.to(x.device) is x))
    out = model(x.unsqueeze(0))
    out.sum().backward()
    show(rank, "output and grad", (out.device, model.weight.grad.device, x.cpu().device))
    norm = torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)  # torch's own norm.to(grads[0].device)
    show(rank, "grad norm device", norm.device)
    branch = "gpu branch" if x.device.type == "cuda" else "cpu branch"
    show(rank, "branch", branch)
    side = torch.cuda.Stream()
    with torch.cuda.stream(side):  # a prefetcher: copy the next batch on a side stream
        batch = torch.arange(3.0).to(device, non_blocking=True)
    torch.cuda.current_stream().wait_stream(side)
    if batch.is_cuda:
        batch.record_stream(torch.cuda.current_stream())
    show(rank, "prefetched", repr(batch))
    def shifted(a):  # compiled whole: a factory placed by the device read off its input
        return a + torch.ones(3, device=a.device)

    show(rank, "compiled", torch.compile(shifted, fullgraph=True, backend="eager")(x).tolist())
    sharded = fully_shard(torch.nn.Linear(3, 1).cuda())  # FSDP2: its parameters are DTensors
    param = next(sharded.parameters())
    inputs = torch.ones(2, 3, device=param.device)
    show(rank, "fsdp2 param", (type(param).__name__, str(param.device), param.is_cuda, inputs.device))
    total = x.sum()
    dist.all_reduce(total)
    show(rank, "all_reduce", repr(total))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
