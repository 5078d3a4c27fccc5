"""How training scripts keep copies of a GPU model's weights, and what each copy sees later:
a "best weights" dict built as `{k: v.cpu() for k, v in model.state_dict().items()}`, one
from `copy.deepcopy(model.state_dict())`, `p.data.clone()`, a model made on the meta device
and `to_empty(device="cuda")` before loading, slices of a device tensor moved to the host,
`copy_` into a host buffer, and what `print` shows of a device tensor.

`--device cuda` (the default) takes the GPU path where torch.cuda says there is one;
`--device cpu` is the same program on the CPU. Where torch's semantics for the two differ
(`.cpu()` copies a CUDA tensor and returns a CPU tensor itself: torch/_tensor_docs.py
"cpu"; `.numpy()` of a CUDA tensor raises), each line is tagged by its key so that a test
can compare the two runs line by line. Started torchrun-style, 2 ranks."""

import argparse
import copy
import os

import torch
import torch.distributed as dist
import torch.nn as nn
from torch.nn.parallel import DistributedDataParallel as DDP


def fmt(t):
    return [round(v, 4) for v in t.detach().reshape(-1).tolist()]


def show(rank, key, value):
    print(f"[rank{rank}] {key}: {value}", flush=True)


def train_and_snapshot(rank, model, ddp, x, y):
    """Three SGD steps; the weights after the first are kept three ways (the "best" epoch)."""
    opt = torch.optim.SGD(ddp.parameters(), lr=0.2)
    for epoch in range(3):
        loss = nn.functional.mse_loss(ddp(x), y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        if epoch == 0:
            host = {k: v.cpu() for k, v in model.state_dict().items()}
            deep = copy.deepcopy(model.state_dict())
            cloned = [p.data.clone() for p in model.parameters()]
            show(rank, "loss0", f"{loss.item():.6f}")
    return host, deep, cloned, loss


def main():
    parser = argparse.ArgumentParser()
    parser.add_argument("--device", default="cuda", choices=["cuda", "cpu"])
    args = parser.parse_args()
    local_rank = int(os.environ.get("LOCAL_RANK", 0))
    on_gpu = args.device == "cuda" and torch.cuda.is_available()
    device = torch.device(f"cuda:{local_rank}") if on_gpu else torch.device("cpu")
    if on_gpu:
        torch.cuda.set_device(local_rank)
    dist.init_process_group("nccl" if on_gpu else "gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = nn.Linear(3, 1).to(device)
    ddp = DDP(model, device_ids=[local_rank] if on_gpu else None)
    g = torch.Generator().manual_seed(rank)
    x, y = torch.randn(8, 3, generator=g).to(device), torch.randn(8, 1, generator=g).to(device)
    host, deep, cloned, loss = train_and_snapshot(rank, model, ddp, x, y)
    final = model.weight.detach().cpu()
    show(rank, "final", fmt(final))
    show(rank, "state_dict_cpu", fmt(host["weight"]))  # GPU: the epoch-0 weights; CPU: the live ones
    show(rank, "deepcopy", fmt(deep["weight"]))
    show(rank, "clone", fmt(cloned[0]))
    show(rank, "moved_since_cpu_snapshot", f"{(final - host['weight']).abs().sum().item():.4f}")
    model.load_state_dict(deep)  # restore the best weights
    show(rank, "restored", fmt(model.weight))

    fresh = nn.Linear(3, 1, device="meta")
    fresh.to_empty(device=device)
    fresh.load_state_dict(model.state_dict())
    show(rank, "to_empty_loaded", fmt(fresh.weight) + fmt(fresh.bias))
    kept = fresh.weight.cpu()
    with torch.no_grad():
        fresh.weight.mul_(2)
    show(rank, "to_empty_cpu_after_update", fmt(kept))  # GPU: as loaded; CPU: doubled

    t = torch.arange(6.0, device=device)
    part, item, listed = t[2:5].cpu(), t[1].item(), t[3:].tolist()
    buf = torch.empty(3)
    buf.copy_(t[:3])
    dist.all_reduce(t)
    t.mul_(10)
    show(rank, "slice_cpu_after_update", fmt(part))  # GPU: [2, 3, 4]; CPU: the updated values
    show(rank, "item_tolist_copy", [item, listed, fmt(buf)])
    show(rank, "printed", str(t[:2]).replace("\n", " "))
    try:
        show(rank, "numpy", t.numpy().tolist())
    except TypeError as e:
        show(rank, "numpy", f"TypeError: {e}")
    show(rank, "loss_printed", repr(loss.detach()))
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
