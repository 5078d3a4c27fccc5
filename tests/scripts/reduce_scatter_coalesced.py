"""reduce_scatter_tensor_coalesced on Gloo, as sequence parallelism issues it (DTensor's
`RowwiseParallel(output_layouts=Shard(0))` goes through the functional collectives, which
call the group's reduce_scatter_tensor_coalesced), and the reduce ops of reduce_scatter_tensor.
ProcessGroupGloo (torch 2.13) runs the coalesced form as one all_reduce of a copy of each
input, in order, and copies each rank's chunk out when the work is waited on. Prints what
each rank got, exactly."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    group = dist.group.WORLD
    for op in ("sum", "avg", "max"):
        inp = torch.arange(4 * world, dtype=torch.float32).reshape(2 * world, 2) * (rank + 1) / 3
        out = funcol.reduce_scatter_tensor(inp, op, 0, group)
        print(f"[{rank}] funcol {op} {out.tolist()}", flush=True)
    a = torch.arange(2 * world, dtype=torch.float32) + rank
    b = torch.ones(world, 3, dtype=torch.float64) * (rank + 1)
    outs = funcol.reduce_scatter_tensor_coalesced([a, b], "sum", [0, 0], group)
    print(f"[{rank}] coalesced {[o.tolist() for o in outs]}", flush=True)
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN):
        out = torch.zeros(2)
        dist.reduce_scatter_tensor(out, torch.arange(2 * world, dtype=torch.float32) * (rank + 1), op=op)
        print(f"[{rank}] reduce_scatter_tensor {op} {out.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
