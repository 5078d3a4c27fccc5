"""Functional collectives (torch.distributed._functional_collectives), as DTensor and
hand-written tensor-parallel code use them: all_reduce / all_gather_tensor /
reduce_scatter_tensor return AsyncCollectiveTensors that are waited on first use or by
wait_tensor; also a group given as a list of ranks and as a DeviceMesh; all_to_all_single,
broadcast and all_reduce_coalesced. Started torchrun-style, any world size."""

import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as funcol
from torch.distributed.device_mesh import init_device_mesh


def main():
    dist.init_process_group("gloo")
    rank, world = dist.get_rank(), dist.get_world_size()
    mesh = init_device_mesh("cpu", (world,))
    x = torch.arange(4, dtype=torch.float32) + rank
    s = funcol.all_reduce(x, "sum", group=dist.group.WORLD)
    s = funcol.wait_tensor(s)
    g = funcol.all_gather_tensor(x, gather_dim=0, group=mesh)
    rs = funcol.reduce_scatter_tensor(torch.ones(world * 2) * (rank + 1), "sum", scatter_dim=0, group=mesh)
    m = funcol.all_reduce(x * 2, "max", group=list(range(world)))
    a = funcol.all_to_all_single(torch.arange(world, dtype=torch.float32) + 10 * rank, None, None, group=mesh)
    b = funcol.broadcast(x.clone(), src=world - 1, group=mesh)
    y = (g.sum() + rs.sum() + m.sum() + a.sum() + b.sum()).item()
    print(f"[rank{rank}] sum {s.tolist()} gathered {g.tolist()} rs {rs.tolist()} max {m.tolist()} "
          f"a2a {a.tolist()} bcast {b.tolist()} total {y:.1f}", flush=True)
    coalesced = funcol.all_reduce_coalesced([x, x * 3], "sum", group=mesh)
    print(f"[rank{rank}] coalesced {[c.tolist() for c in coalesced]}", flush=True)
    # autograd through the functional all_reduce: not differentiable (torch warns), so the
    # gradient is the local term's only
    w = torch.ones(3, requires_grad=True)
    out = funcol.all_reduce(w * (rank + 1), "sum", group=mesh)
    (out.sum() if out.requires_grad else (w * (rank + 1)).sum()).backward()
    print(f"[rank{rank}] requires_grad {out.requires_grad} grad {w.grad.tolist()}", flush=True)
    dist.destroy_process_group()


if __name__ == "__main__":
    main()
