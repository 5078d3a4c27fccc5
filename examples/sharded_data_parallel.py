"""Hand-written sharded data parallelism (ZeRO-3 / FSDP style) on flat parameter shards.

Each of the ranks keeps only its shard of one flat parameter vector. Every step it
gathers the full vector with `all_gather_into_tensor`, runs forward and backward on its
own batch, reduce-scatters the flat gradient with `reduce_scatter_tensor` (each rank
gets the sum of its shard's gradients) and updates its shard. On Gloo the
reduce-scatter is one all_reduce of the whole gradient (then each rank keeps its
chunk), so its float sums follow the ring all_reduce's order.

    torchrun --nproc-per-node 4 examples/sharded_data_parallel.py
    simdist run examples/sharded_data_parallel.py --nproc-per-node 4
"""

import argparse

import torch
import torch.distributed as dist
import torch.nn.functional as F


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--steps", type=int, default=4)
    p.add_argument("--hidden", type=int, default=16)
    p.add_argument("--lr", type=float, default=0.05)
    return p.parse_args()


def unflatten(flat, shapes):
    out, off = [], 0
    for shape in shapes:
        n = torch.Size(shape).numel()
        out.append(flat[off:off + n].view(shape))
        off += n
    return out


def main():
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")

    shapes = [(args.hidden, 8), (args.hidden,), (1, args.hidden), (1,)]
    numel = sum(torch.Size(s).numel() for s in shapes)
    padded = (numel + world - 1) // world * world
    torch.manual_seed(0)
    full = torch.zeros(padded, device=device)
    full[:numel] = torch.randn(numel, device=device) * 0.3
    shard = full.chunk(world)[rank].clone()

    g = torch.Generator().manual_seed(rank)
    for step in range(args.steps):
        x = torch.randn(16, 8, generator=g).to(device)
        y = torch.sin(x.sum(dim=1, keepdim=True))
        gathered = torch.empty(padded, device=device)
        dist.all_gather_into_tensor(gathered, shard)
        flat = gathered.requires_grad_()
        w1, b1, w2, b2 = unflatten(flat[:numel], shapes)
        loss = F.mse_loss(F.linear(torch.tanh(F.linear(x, w1, b1)), w2, b2), y)
        loss.backward()
        grad_shard = torch.empty_like(shard)
        dist.reduce_scatter_tensor(grad_shard, flat.grad / world)
        with torch.no_grad():
            shard -= args.lr * grad_shard
        print(f"rank {rank} step {step}: loss {loss.item()!r} shard norm {shard.norm().item()!r}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
