"""Two kinds of deadline at once: a Gloo timeout (the world's, `init_process_group(timeout=A)`)
and new_group's store wait (`new_group(timeout=B)`); whichever comes first frees a rank that
then ends the other's wait. Any world size of 2 or more (3 or more for `relay`).

    python deadline_order.py all_reduce A B   # torchrun-style
    python deadline_order.py monitored A B
    python deadline_order.py wait A B
    python deadline_order.py relay A B

`all_reduce`: rank 0 all_reduces over the world, then makes the group of every rank; the
others make the group first, and all_reduce only if that raised. A < B: rank 0's all_reduce
times out, it then makes the group with the others. B < A: the others' new_group raises,
they then join rank 0's all_reduce, and rank 0's new_group meets addresses whose processes
left it (refused).

`monitored`: the same with `monitored_barrier(timeout=A)` in place of the all_reduce (its
own timeout, not the group's).

`wait`: rank 0 starts an all_reduce and waits for it with `Work.wait(timeout=A)` (its wait's
timeout, not the group's: the op goes on); the others make the group, then join the
all_reduce. A < B: rank 0's wait raises, it makes the group, then waits again and gets
the sum. B < A: the others' new_group raises, they join, rank 0's wait returns, its
new_group is refused.

`relay`: rank 1 makes the group of ranks 1.. (not rank 0), and only if that raised sends to
every other rank; every other rank first receives from rank 1, then ranks 2.. make the
group. A < B: the receives time out, ranks 2.. then make the group with rank 1. B < A:
rank 1's new_group raises, its sends end the receives, and ranks 2.. are refused.
"""
import datetime
import sys

import torch
import torch.distributed as dist

mode, a, b = sys.argv[1], float(sys.argv[2]), float(sys.argv[3])
# (`wait`: the world keeps torch's default timeout, so that only the wait's ends at A)
dist.init_process_group("gloo", timeout=None if mode == "wait" else datetime.timedelta(seconds=a))
rank, world = dist.get_rank(), dist.get_world_size()
group_timeout = datetime.timedelta(seconds=b)


def attempt(what, fn):
    """Run `fn`, print how it went; whether it raised."""
    try:
        result = fn()
    except RuntimeError as e:
        print(rank, what, "raised", type(e).__name__, flush=True)
        return True
    print(rank, what, "ok" if result is None else result, flush=True)
    return False


def all_reduce():
    t = torch.ones(1)
    dist.all_reduce(t)
    return t.item()


def monitored():
    dist.monitored_barrier(timeout=datetime.timedelta(seconds=a))


def receive():
    t = torch.zeros(1)
    dist.recv(t, src=1)
    return t.item()


if mode in ("all_reduce", "monitored"):
    collective = all_reduce if mode == "all_reduce" else monitored
    if rank == 0:
        attempt(mode, collective)
        attempt("new_group", lambda: dist.new_group(list(range(world)), timeout=group_timeout) and None)
    elif attempt("new_group", lambda: dist.new_group(list(range(world)), timeout=group_timeout) and None):
        attempt(mode, collective)
elif mode == "wait":
    t = torch.ones(1)
    if rank == 0:
        work = dist.all_reduce(t, async_op=True)
        late = attempt("wait", lambda: work.wait(timeout=datetime.timedelta(seconds=a)) and t.item())
        attempt("new_group", lambda: dist.new_group(list(range(world)), timeout=group_timeout) and None)
        if late:
            attempt("wait", lambda: work.wait() and t.item())
    else:
        attempt("new_group", lambda: dist.new_group(list(range(world)), timeout=group_timeout) and None)
        attempt("all_reduce", all_reduce)
elif mode == "relay":
    members = list(range(1, world))
    if rank == 1:
        if attempt("new_group", lambda: dist.new_group(members, timeout=group_timeout) and None):
            for peer in [0] + members[1:]:
                dist.send(torch.full((1,), 7.0), dst=peer)
    else:
        attempt("recv", receive)
        if rank > 1:
            attempt("new_group", lambda: dist.new_group(members, timeout=group_timeout) and None)
dist.destroy_process_group()
