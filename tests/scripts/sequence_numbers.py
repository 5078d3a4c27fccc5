# ruff: noqa: E702 - one line per op and the look after it, as the probe reads
"""Gloo's per-group sequence number (`ProcessGroup._get_sequence_number_for_group`, and its
backend's) after each kind of operation, on the world and on a subgroup of ranks 0 and 1:
every op this rank issued on the group counts, p2p included, and the ops Gloo runs as several
(a list reduce_scatter, monitored_barrier, the object collectives) count each part. Printed
once per rank at the end, so the lines of ranks do not interleave."""

import torch
import torch.distributed as dist

dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
pg = dist.group.WORLD
sub = dist.new_group([0, 1])
seen = []


def note(what, group=pg):
    be = group._get_backend(torch.device("cpu"))
    seen.append(f"{what}={group._get_sequence_number_for_group()}/{be._get_sequence_number_for_group()}")


note("init")
dist.all_reduce(torch.ones(2)); note("all_reduce")
dist.barrier(); note("barrier")
dist.monitored_barrier(); note("monitored_barrier")
if rank == 0:
    dist.send(torch.ones(1), 1)
elif rank == 1:
    dist.recv(torch.ones(1), 0)
note("send_recv")
dist.reduce_scatter(torch.zeros(1), [torch.ones(1) for _ in range(world)]); note("reduce_scatter")
dist.reduce_scatter_tensor(torch.zeros(1), torch.ones(world)); note("reduce_scatter_tensor")
dist.all_gather([torch.zeros(1) for _ in range(world)], torch.ones(1)); note("all_gather")
dist.all_gather_object([None] * world, {"a": 1}); note("all_gather_object")
dist.broadcast_object_list([1, 2], 0); note("broadcast_object_list")
w = dist.all_reduce(torch.ones(2), async_op=True); note("async_issued"); w.wait(); note("async_waited")
ops = [dist.P2POp(dist.isend, torch.ones(1), (rank + 1) % world),
       dist.P2POp(dist.irecv, torch.zeros(1), (rank - 1) % world)]
for w in dist.batch_isend_irecv(ops):
    w.wait()
note("batch_isend_irecv")
dist.all_to_all_single(torch.zeros(world), torch.ones(world)); note("all_to_all_single")
dist.gather(torch.ones(1), [torch.zeros(1) for _ in range(world)] if rank == 0 else None); note("gather")
dist.scatter(torch.zeros(1), [torch.ones(1) for _ in range(world)] if rank == 0 else None); note("scatter")
dist.broadcast(torch.ones(1), 0); note("broadcast")
if rank < 2:
    note("sub_init", sub)
    dist.all_reduce(torch.ones(1), group=sub); note("sub_all_reduce", sub)
    dist.monitored_barrier(group=sub); note("sub_monitored_barrier", sub)
note("world_after_sub")
print(rank, " ".join(seen), flush=True)
dist.destroy_process_group()
