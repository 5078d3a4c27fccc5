"""Where the results of a compiled model are, on the GPUs: a 2-layer MLP on `cuda:LOCAL_RANK`
and a loss function, each `torch.compile`d with `--backend` (inductor, its default) or left
uncompiled (`--backend uncompiled`), run once under `torch.no_grad()` and once with
gradients. Each rank prints, per mode, the output's and the loss's device, whether `.numpy()`
of the loss is refused (a GPU tensor's is), and (under no_grad, where only they are live)
the GPU memory they hold; then the all-reduced loss. On a GPU compiling changes none of
these. Started torchrun-style."""

import argparse
import os

import torch
import torch.distributed as dist
import torch.nn as nn


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--backend", default="inductor", choices=["inductor", "aot_eager", "eager", "uncompiled"])
    args = p.parse_args()
    rank, local = int(os.environ["RANK"]), int(os.environ["LOCAL_RANK"])
    torch.cuda.set_device(local)
    dist.init_process_group("nccl")
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(8, 16), nn.ReLU(), nn.Linear(16, 4)).cuda()
    model, loss_fn = net, lambda o: (o ** 2).mean()
    if args.backend != "uncompiled":
        model, loss_fn = torch.compile(net, backend=args.backend), torch.compile(loss_fn, backend=args.backend)
    x = torch.randn(16, 8, generator=torch.Generator().manual_seed(rank)).cuda()
    for grad in (False, True):
        base = torch.cuda.memory_allocated()
        with torch.set_grad_enabled(grad):
            out = model(x)
            loss = loss_fn(out)
        try:
            loss.detach().numpy()
            numpy = "allowed"
        except TypeError:
            numpy = "refused"
        held = "" if grad else f" holding {torch.cuda.memory_allocated() - base} bytes"
        print(f"[rank{rank}] {'grad' if grad else 'no_grad'}: out on {out.device}, loss on {loss.device},"
              f" numpy {numpy}{held}", flush=True)
        if grad:
            loss.backward()
    total = loss.detach().clone()
    dist.all_reduce(total)
    print(f"[rank{rank}] total: {total.item():.5f} on {total.device}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
