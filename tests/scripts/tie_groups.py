"""Two Gloo deadlines in different groups, within `deadlines.TIE_S` of each other: rank 0's
all_reduce over the world (`init_process_group(timeout=A)`; rank 1 never joins it) and rank
1's receive from rank 0 on a group of both (`new_group(timeout=B)`). Two ranks.

    python tie_groups.py A B   # torchrun-style, --nproc-per-node 2

A < B: rank 0's all_reduce times out, it sends on the other group, rank 1 receives (the
timeout closed rank 0's pairs in the world only). B < A: rank 1's receive times out, it
leaves, and rank 0's all_reduce fails (its own timeout or rank 1's exit: printed alike).
"""
import datetime
import sys

import torch
import torch.distributed as dist

a, b = float(sys.argv[1]), float(sys.argv[2])
dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=a))
rank = dist.get_rank()
pair = dist.new_group([0, 1], timeout=datetime.timedelta(seconds=b))


def failed(what: str, e: RuntimeError) -> None:
    print(rank, what, "raised", type(e).__name__, "timed out" if "Timed out waiting" in str(e) else "")


if rank == 0:
    try:
        dist.all_reduce(torch.ones(1))
        print(rank, "all_reduce ok")
    except RuntimeError as e:
        print(rank, "all_reduce raised", type(e).__name__)
    try:
        dist.send(torch.full((1,), 7.0), 1, group=pair)
        print(rank, "sent")
    except RuntimeError as e:
        failed("send", e)
else:
    x = torch.zeros(1)
    try:
        dist.recv(x, 0, group=pair)
        print(rank, "recv", x.item())
    except RuntimeError as e:
        failed("recv", e)
dist.destroy_process_group()
