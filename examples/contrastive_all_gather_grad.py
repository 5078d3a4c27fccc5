"""CLIP-style contrastive training: each rank embeds its own batch, the embeddings are
gathered from every rank with the differentiable torch.distributed.nn.all_gather (its
backward sends each rank the gradient of its own slice), and the loss is computed against
the global batch. The encoders are called through model.module, so DDP's hooks do not
reduce their gradients: the script all-reduces them itself (AVG). Prints each step's loss
and a parameter checksum, equal on every rank.

    torchrun --nproc-per-node 3 examples/contrastive_all_gather_grad.py
    simdist compare examples/contrastive_all_gather_grad.py --nproc-per-node 3
"""
import os

import torch
import torch.distributed as dist
import torch.distributed.nn as dist_nn
import torch.nn.functional as F
from torch.nn.parallel import DistributedDataParallel as DDP


def main():
    dist.init_process_group("nccl" if torch.cuda.is_available() else "gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device("cuda", int(os.environ["LOCAL_RANK"])) if torch.cuda.is_available() else torch.device("cpu")
    torch.manual_seed(0)
    img, txt = torch.nn.Linear(6, 4).to(device), torch.nn.Linear(5, 4).to(device)
    model = DDP(torch.nn.ModuleDict({"img": img, "txt": txt}))
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for step in range(3):
        xi, xt = torch.randn(4, 6, generator=g).to(device), torch.randn(4, 5, generator=g).to(device)
        zi = F.normalize(model.module["img"](xi), dim=1)
        zt = F.normalize(model.module["txt"](xt), dim=1)
        all_zi = torch.cat(dist_nn.all_gather(zi))
        all_zt = torch.cat(dist_nn.all_gather(zt))
        logits = all_zi @ all_zt.t() / 0.1
        labels = torch.arange(len(logits), device=device)
        loss = (F.cross_entropy(logits, labels) + F.cross_entropy(logits.t(), labels)) / 2
        opt.zero_grad()
        loss.backward()
        for p in model.parameters():  # model.module was called: DDP did not reduce, do it by hand
            dist.all_reduce(p.grad, op=dist.ReduceOp.AVG)
        opt.step()
        print(f"rank {rank} step {step}: loss {loss.item():.6f}", flush=True)
    s = sum(p.detach().sum() for p in model.parameters())
    print(f"rank {rank}: checksum {s.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
