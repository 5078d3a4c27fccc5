"""1-D heat diffusion split across ranks: each step exchanges one halo cell with each
neighbour by dist.batch_isend_irecv, then relaxes. The loop stops on convergence: with
--local each rank stops on its own residual (a bug: a rank that converges first leaves its
neighbours' exchange unanswered); by default the residual is all-reduced with MAX first.

    torchrun --nproc-per-node 3 examples/halo_exchange_converge.py [--local]
    simdist compare examples/halo_exchange_converge.py --nproc-per-node 3
"""

import argparse

import torch
import torch.distributed as dist


def exchange(u, rank, world):
    left, right = torch.zeros(1, dtype=u.dtype), torch.zeros(1, dtype=u.dtype)
    ops = []
    if rank > 0:
        ops += [dist.P2POp(dist.isend, u[1:2].clone(), rank - 1), dist.P2POp(dist.irecv, left, rank - 1)]
    if rank < world - 1:
        ops += [dist.P2POp(dist.isend, u[-2:-1].clone(), rank + 1), dist.P2POp(dist.irecv, right, rank + 1)]
    if ops:
        for w in dist.batch_isend_irecv(ops):
            w.wait()
    if rank > 0:
        u[0] = left
    if rank < world - 1:
        u[-1] = right


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--cells", type=int, default=4)
    ap.add_argument("--tol", type=float, default=0.02)
    ap.add_argument("--max-steps", type=int, default=200)
    ap.add_argument("--local", action="store_true")
    args = ap.parse_args()
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    u = torch.zeros(args.cells + 2, dtype=torch.float64)  # one halo cell each side
    u[1:-1] = float(rank * rank)  # an uneven start: the ranks converge at different steps
    for step in range(args.max_steps):
        exchange(u, rank, world)
        new = u.clone()
        new[1:-1] = 0.5 * u[1:-1] + 0.25 * (u[:-2] + u[2:])
        if rank == 0:
            new[1] = 0.75 * u[1] + 0.25 * u[2]  # insulated ends
        if rank == world - 1:
            new[-2] = 0.75 * u[-2] + 0.25 * u[-3]
        res = torch.tensor([(new - u)[1:-1].abs().max().item()], dtype=torch.float64)
        u = new
        if not args.local:
            dist.all_reduce(res, op=dist.ReduceOp.MAX)
        if res.item() < args.tol:
            break
    total = u[1:-1].sum().unsqueeze(0)
    print(f"rank {rank}: stopped after step {step}, local heat {total.item():.6f}", flush=True)
    dist.all_reduce(total)
    print(f"rank {rank}: total heat {total.item():.6f}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
