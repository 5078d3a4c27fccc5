"""A two-stage pipeline: stage 0 sends activations forward, stage 1 sends gradients back.

Two ranks split a small MLP in half. For each micro-batch, stage 0 runs its half and
`send`s the activations; stage 1 `recv`s them, finishes the forward pass, computes the
loss and `send`s the gradient of its input back, which stage 0 `recv`s to run its own
backward. Both stages step their optimizers after all micro-batches (GPipe-style, one
micro-batch in flight). The script starts its own ranks with mp.spawn.

    python examples/pipeline_two_stage.py
    simdist run examples/pipeline_two_stage.py
"""

import argparse
import os

import torch
import torch.distributed as dist
import torch.multiprocessing as mp
import torch.nn.functional as F


def stage_model(stage):
    torch.manual_seed(stage)
    if stage == 0:
        return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU())
    return torch.nn.Sequential(torch.nn.Linear(12, 1))


def run(rank, args):
    os.environ.setdefault("MASTER_ADDR", "127.0.0.1")
    os.environ.setdefault("MASTER_PORT", "29611")
    dist.init_process_group("gloo", rank=rank, world_size=2)
    model = stage_model(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7)
    data = [(torch.randn(4, 6, generator=g), torch.randn(4, 1, generator=g)) for _ in range(args.micro_batches)]

    for step in range(args.steps):
        opt.zero_grad()
        total = 0.0
        for x, y in data[: args.micro_batches if rank == 1 else len(data)]:
            if rank == 0:
                act = model(x)
                dist.send(act.detach(), dst=1)
                grad = torch.empty_like(act)
                dist.recv(grad, src=1)
                act.backward(grad)
            else:
                act = torch.empty(4, 12)
                dist.recv(act, src=0)
                act.requires_grad_()
                loss = F.mse_loss(model(act), y)
                loss.backward()
                dist.send(act.grad, dst=0)
                total += loss.item()
        opt.step()
        if rank == 1:
            print(f"step {step}: mean micro-batch loss {total / args.micro_batches:.6f}")
    print(f"stage {rank} done")
    dist.destroy_process_group()


if __name__ == "__main__":
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=3)
    p.add_argument("--micro-batches", type=int, default=4)
    mp.spawn(run, args=(p.parse_args(),), nprocs=2)
