"""Mixture-of-experts token routing with `all_to_all_single` and uneven splits.

Each rank holds one expert and a batch of tokens. A router sends every token to the
expert with the highest score, so ranks send different numbers of tokens to each other:
first the per-destination counts are exchanged (an all_to_all_single of one count per
rank), then the tokens themselves (uneven input/output split sizes), the experts run,
and the results travel back with the reverse split sizes.

    torchrun --nproc-per-node 3 examples/moe_all_to_all.py
    simdist run examples/moe_all_to_all.py --nproc-per-node 3
"""

import argparse

import torch
import torch.distributed as dist


def parse_args():
    p = argparse.ArgumentParser(description=__doc__)
    p.add_argument("--tokens", type=int, default=10)
    p.add_argument("--dim", type=int, default=4)
    p.add_argument("--steps", type=int, default=2)
    return p.parse_args()


def main():
    args = parse_args()
    backend = "nccl" if torch.cuda.is_available() else "gloo"
    dist.init_process_group(backend)
    rank, world = dist.get_rank(), dist.get_world_size()
    device = torch.device(f"cuda:{rank}") if backend == "nccl" else torch.device("cpu")

    torch.manual_seed(0)
    router = torch.nn.Linear(args.dim, world, bias=False).to(device)
    torch.manual_seed(100 + rank)
    expert = torch.nn.Linear(args.dim, args.dim).to(device)
    g = torch.Generator().manual_seed(rank)

    for step in range(args.steps):
        tokens = torch.randn(args.tokens, args.dim, generator=g).to(device)
        with torch.no_grad():
            dest = router(tokens).argmax(dim=1)
        order = torch.argsort(dest, stable=True)
        send_counts = torch.bincount(dest, minlength=world)
        recv_counts = torch.empty_like(send_counts)
        dist.all_to_all_single(recv_counts, send_counts)

        in_splits, out_splits = send_counts.tolist(), recv_counts.tolist()
        received = torch.empty(sum(out_splits), args.dim, device=device)
        dist.all_to_all_single(received, tokens[order], out_splits, in_splits)
        with torch.no_grad():
            processed = expert(received)
        returned = torch.empty(args.tokens, args.dim, device=device)
        dist.all_to_all_single(returned, processed, in_splits, out_splits)
        out = torch.empty_like(returned)
        out[order] = returned
        print(f"rank {rank} step {step}: sent {in_splits}, received {out_splits}, checksum {out.sum().item():.6f}")
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
