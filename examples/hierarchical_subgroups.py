"""Hierarchical gradient averaging with dist.new_subgroups() (intra-node groups) and a
cross-node group made with new_group(use_local_synchronization=True), which only its
members call. Prints what each group's collectives gave.

    torchrun --nproc-per-node 4 examples/hierarchical_subgroups.py
    simdist compare examples/hierarchical_subgroups.py --nproc-per-node 4
"""

import torch
import torch.distributed as dist


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    per_node = 2 if world % 2 == 0 else 1
    cur, groups = dist.new_subgroups(group_size=per_node)
    node = rank // per_node
    print(f"rank {rank}: node {node}, local group ranks {dist.get_process_group_ranks(cur)}, "
          f"group rank {dist.get_rank(cur)} of {dist.get_world_size(cur)}, {len(groups)} groups", flush=True)

    leaders = list(range(0, world, per_node))
    leader_group = None
    if rank in leaders:
        leader_group = dist.new_group(leaders, use_local_synchronization=True)

    grad = torch.arange(4, dtype=torch.float32) * (rank + 1)
    dist.all_reduce(grad, group=cur)               # sum within the node
    if leader_group is not None:
        dist.all_reduce(grad, group=leader_group)  # sum across nodes
    dist.broadcast(grad, src=node * per_node, group=cur)  # leaders tell their node
    grad /= world
    print(f"rank {rank}: averaged {grad.tolist()}", flush=True)

    # subgroups by enumeration, every rank calls it with the same lists
    evens_odds, _ = dist.new_subgroups_by_enumeration([list(range(0, world, 2)), list(range(1, world, 2))])
    x = torch.tensor([float(rank)])
    dist.all_reduce(x, op=dist.ReduceOp.MAX, group=evens_odds)
    print(f"rank {rank}: max of my parity {x.item()}", flush=True)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
