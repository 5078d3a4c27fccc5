"""Post-local SGD (torch.distributed.algorithms): DDP all-reduces gradients globally for the
first iterations, then its post_localSGD_hook all-reduces only within a subgroup (here pairs of
ranks made by dist.new_subgroups), and a PeriodicModelAverager in a PostLocalSGDOptimizer
averages the parameters over the whole world every `period` steps. Printed: each rank's
parameter checksum after training (equal within a pair, across pairs only after an
averaging step).

    torchrun --nproc-per-node 4 examples/post_local_sgd.py
    simdist compare examples/post_local_sgd.py --nproc-per-node 4
"""

import argparse

import torch
import torch.distributed as dist
import torch.distributed.algorithms.model_averaging.averagers as averagers
import torch.nn.functional as F
from torch.distributed.algorithms.ddp_comm_hooks.post_localSGD_hook import PostLocalSGDState, post_localSGD_hook
from torch.distributed.optim import PostLocalSGDOptimizer
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--steps", type=int, default=7)
    ap.add_argument("--warmup", type=int, default=3)
    ap.add_argument("--period", type=int, default=2)
    ap.add_argument("--group-size", type=int, default=2)
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    subgroup, _ = dist.new_subgroups(group_size=args.group_size)
    torch.manual_seed(0)
    model = DDP(torch.nn.Sequential(torch.nn.Linear(5, 8), torch.nn.Tanh(), torch.nn.Linear(8, 1)))
    state = PostLocalSGDState(process_group=None, subgroup=subgroup, start_localSGD_iter=args.warmup)
    model.register_comm_hook(state, post_localSGD_hook)
    opt = PostLocalSGDOptimizer(
        optim=torch.optim.SGD(model.parameters(), lr=0.05),
        averager=averagers.PeriodicModelAverager(period=args.period, warmup_steps=args.warmup),
    )
    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(16, 5, generator=g)
        loss = F.mse_loss(model(x), x.sum(1, keepdim=True))
        opt.zero_grad()
        loss.backward()
        opt.step()
        checksum = sum(p.detach().double().sum().item() for p in model.parameters())
        print(f"rank {rank} step {step}: loss {loss.item():.6f} params {checksum:.9f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
