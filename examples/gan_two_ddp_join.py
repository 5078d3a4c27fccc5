"""A GAN with two DDP models (generator and discriminator) under one Join, uneven data.

Each rank trains a tiny generator/discriminator pair, both wrapped in DDP, on its own
number of batches (rank r has `--batches + r`), so the loop runs under
`Join([generator, discriminator])`. Per iteration the discriminator is trained on real
and generated samples, then the generator through the discriminator. A joined rank's
join hooks shadow each model's gradient all-reduce in the order of the Join list, once
per iteration. But the ranks still training run the discriminator twice per iteration
(its own step, then inside the generator's step), so after the first rank joins, the
shadows and the real all-reduces pair up out of step: a one-float all-reduce meets a
whole gradient bucket, and Gloo aborts the rank that receives more than it expects.

    torchrun --nproc-per-node 2 examples/gan_two_ddp_join.py
    simdist run examples/gan_two_ddp_join.py --nproc-per-node 2
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.algorithms.join import Join
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--batches", type=int, default=3)
    args = p.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    torch.manual_seed(0)
    generator = DDP(torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 2)))
    discriminator = DDP(torch.nn.Sequential(torch.nn.Linear(2, 8), torch.nn.ReLU(), torch.nn.Linear(8, 1)))
    opt_g = torch.optim.Adam(generator.parameters(), lr=1e-3)
    opt_d = torch.optim.Adam(discriminator.parameters(), lr=1e-3)
    g = torch.Generator().manual_seed(rank)
    batches = [torch.randn(8, 2, generator=g) * 0.5 + 2.0 for _ in range(args.batches + rank)]

    with Join([generator, discriminator]):
        for step, real in enumerate(batches):
            fake = generator(torch.randn(8, 2, generator=g))
            # discriminator step: real vs generated in one forward pass
            logits = discriminator(torch.cat([real, fake.detach()]))
            target = torch.cat([torch.ones(8, 1), torch.zeros(8, 1)])
            loss_d = F.binary_cross_entropy_with_logits(logits, target)
            opt_d.zero_grad()
            loss_d.backward()
            opt_d.step()
            # generator step: fool the discriminator
            loss_g = F.binary_cross_entropy_with_logits(discriminator(fake), torch.ones(8, 1))
            opt_g.zero_grad()
            loss_g.backward()
            opt_g.step()
            print(f"rank {rank} step {step}: loss_d {loss_d.item():.5f} loss_g {loss_g.item():.5f}")
    print(f"rank {rank}: {len(batches)} batches, loss_d {loss_d.item():.5f} loss_g {loss_g.item():.5f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
