"""A two-stage pipeline where the stages disagree on the number of micro-batches.

Stage 0 cuts each batch with `batch.split(micro_batch_size)`, which yields a last, smaller
micro-batch when the batch size is not a multiple of it (18 = 4 + 4 + 4 + 4 + 2); stage 1
counts `batch_size // micro_batch_size` micro-batches (4). Stage 0's extra send is
received by stage 1 as the first micro-batch of the next step, and from then on the
sends and receives of the two stages are off by one, with different sizes.

    torchrun --nproc-per-node 2 examples/pipeline_extra_microbatch.py
    simdist run examples/pipeline_extra_microbatch.py --nproc-per-node 2
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F


def stage_model(stage):
    torch.manual_seed(stage)
    if stage == 0:
        return torch.nn.Sequential(torch.nn.Linear(6, 12), torch.nn.ReLU())
    return torch.nn.Sequential(torch.nn.Linear(12, 1))


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=2)
    p.add_argument("--batch-size", type=int, default=18)
    p.add_argument("--micro-batch-size", type=int, default=4)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    model = stage_model(rank)
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(7)
    batches = [(torch.randn(args.batch_size, 6, generator=g), torch.randn(args.batch_size, 1, generator=g))
               for _ in range(args.steps)]
    mb = args.micro_batch_size

    for step, (x, y) in enumerate(batches):
        opt.zero_grad()
        if rank == 0:
            for xm in x.split(mb):  # 5 micro-batches: the last one has 2 rows
                act = model(xm)
                dist.send(act.detach(), dst=1)
                grad = torch.empty_like(act)
                dist.recv(grad, src=1)
                act.backward(grad)
        else:
            total = 0.0
            for k in range(args.batch_size // mb):  # 4 micro-batches
                act = torch.empty(mb, 12)
                dist.recv(act, src=0)
                act.requires_grad_()
                loss = F.mse_loss(model(act), y[k * mb:(k + 1) * mb])
                loss.backward()
                dist.send(act.grad, dst=0)
                total += loss.item()
            print(f"step {step}: mean micro-batch loss {total / (args.batch_size // mb):.6f}")
        opt.step()
    print(f"stage {rank} done")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
