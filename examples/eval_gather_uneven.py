"""Evaluation that gathers every rank's predictions on rank 0 to compute a metric over the
whole validation set. Each rank scores its own strided shard (range(rank, n, world)), so
with n not a multiple of the world size the shards differ in length: all_gather of
tensors needs equal sizes. --fix gathers them with all_gather_object instead.

    torchrun --nproc-per-node 3 examples/eval_gather_uneven.py [--fix]
    simdist compare examples/eval_gather_uneven.py --nproc-per-node 3 -- --fix
"""

import argparse

import torch
import torch.distributed as dist


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--fix", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    model = torch.nn.Linear(3, 1)
    x = torch.randn(args.n, 3, generator=torch.Generator().manual_seed(1))
    idx = list(range(rank, args.n, world))
    with torch.no_grad():
        pred = model(x[idx]).squeeze(1)
    print(f"rank {rank}: {len(idx)} samples", flush=True)
    if args.fix:
        parts = [None] * world
        dist.all_gather_object(parts, (idx, pred.tolist()))
        merged = sorted((i, p) for ids, ps in parts for i, p in zip(ids, ps))
        preds = torch.tensor([p for _, p in merged])
    else:
        parts = [torch.empty_like(pred) for _ in range(world)]
        dist.all_gather(parts, pred)
        preds = torch.cat(parts)
    if rank == 0:
        print(f"{len(preds)} predictions, mean {preds.mean().item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
