"""A script's own exchange through the default store (`c10d._get_default_store()`): torchrun
gives every rank a client of one store, so what one rank writes the others read.

    python store_exchange.py MODE [A B]   # torchrun-style, 2 ranks or more

`set_get`: rank 0 sets a key, a barrier, every rank gets it; `add`: every rank adds rank + 1 to
a counter, a barrier, every rank reads the sum; `leader`: every rank tries `compare_set` on a
missing key; the winner is whoever came first, every rank reads the same one; `wait_many`:
rank 0 and the last rank each set a key, every rank waits for both and `multi_get`s them;
`semantics`: rank 0 alone, TCPStore's rules (compare_set on a missing key, add on "7 ",
delete, check, append); `never`: every rank gets a key nobody sets (a hang); `timeout A`:
the store's timeout is A s and the last rank gets a key nobody sets; `vs_gloo A B`: the
world's timeout is B s and the store's A s; rank 0 gets a key nobody has set while the others
all_reduce with it: whichever timeout comes first ends its wait, and then the others' (A < B:
rank 0 raises and joins the all_reduce; B < A: the all_reduce times out and rank 1 sets the key);
`elastic`: torch elastic's `synchronize` and `barrier` (`torch.distributed.elastic.utils.store`)
over a `PrefixStore` of the default store; `elastic_missing A`: the last rank never enters that
barrier (timeout A s, with rank tracing): the others raise, rank 0 naming the missing rank;
`add_text`: rank 0 adds to a key whose value is no number, then gets and checks a key;
`own_client`: the script makes its own client of torchrun's store (MASTER_ADDR, MASTER_PORT);
`late A B`: rank 0's get of a key nobody sets times out at A s, then it sets a key and adds to
a counter; rank 1 sleeps B s (B > A) and then checks that key and adds: in simulated time rank
0 comes first, though rank 1's calls may reach a simulated store first (rank 0's timeout is
only known once nothing else can happen before it); `after_destroy`: every rank destroys its
default group, then rank 0 sets a key through the store it kept and the others get it.
"""
import datetime
import os
import sys

import torch
import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

mode = sys.argv[1]
nums = [float(x) for x in sys.argv[2:]]
world_timeout = datetime.timedelta(seconds=nums[1]) if mode == "vs_gloo" else None
dist.init_process_group("gloo", timeout=world_timeout)
# no rank runs ahead and exits while a peer is still connecting the world: Gloo returns from
# init once a rank's own side of each pair is up, so a rank that ended right after init (the
# store-only modes) could make a descheduled peer fail in connectFullMesh with "Connection
# closed by peer" (a real race, `simdist.races.ConnectRace`; seen under CI load)
dist.barrier()
rank, world = dist.get_rank(), dist.get_world_size()
store = c10d._get_default_store()
if mode == "set_get":
    if rank == 0:
        store.set("k", f"from rank 0 of {world}")
    dist.barrier()
    print(rank, "got", store.get("k"), flush=True)
elif mode == "add":
    store.add("counter", rank + 1)
    dist.barrier()
    print(rank, "reads", store.add("counter", 0), "=", world * (world + 1) // 2, flush=True)
elif mode == "leader":
    mine = store.compare_set("leader", "", str(rank))
    won = mine == str(rank).encode()
    count = torch.tensor([int(won)])
    dist.all_reduce(count)
    print(rank, "leaders:", int(count), "agree:", store.get("leader") == mine, flush=True)
elif mode == "wait_many":
    if rank in (0, world - 1):
        store.set(f"key{rank}", f"v{rank}")
    store.wait(["key0", f"key{world - 1}"])
    print(rank, "sees", store.multi_get(["key0", f"key{world - 1}"]), flush=True)
elif mode == "semantics":
    if rank == 0:
        print("cs missing, expected empty:", store.compare_set("m1", "", "new"), store.get("m1"), flush=True)
        print("cs missing, expected x:", store.compare_set("m2", "x", "new"), store.check(["m2"]), flush=True)
        store.set("a", "x")
        print("cs match:", store.compare_set("a", "x", "y"), "mismatch:", store.compare_set("a", "zz", "q"), flush=True)
        store.set("s", "7 ")
        print("add on '7 ':", store.add("s", 1), "add new:", store.add("n", -3), flush=True)
        print("delete:", store.delete_key("a"), store.delete_key("a"), "check:", store.check(["a"]), store.check([]),
              flush=True)
        store.append("ap", "1")
        store.append("ap", b"\x00\xff")
        store.multi_set(["x1", "x2"], ["1", "2"])
        print("append:", store.get("ap"), "multi:", store.multi_get(["x1", "x2"]), flush=True)
    dist.barrier()
elif mode == "never":
    print(rank, "gets a key nobody sets", flush=True)
    store.get("never")
elif mode == "timeout":
    store.set_timeout(datetime.timedelta(seconds=nums[0]))
    if rank == world - 1:
        print(rank, "gets a key nobody sets", flush=True)
        store.get("never")  # its timeout ends it
    dist.barrier()
elif mode == "vs_gloo":
    store.set_timeout(datetime.timedelta(seconds=nums[0]))
    if rank == 0:
        try:
            print(rank, "got", store.get("late"), flush=True)
        except dist.DistStoreError as e:
            print(rank, "store wait ended:", type(e).__name__, flush=True)
            dist.all_reduce(torch.ones(1))
            print(rank, "then all_reduce done", flush=True)
    else:
        try:
            t = torch.ones(1)
            dist.all_reduce(t)
            print(rank, "all_reduce done", float(t), flush=True)
        except RuntimeError as e:
            print(rank, "all_reduce ended:", type(e).__name__, flush=True)
            if rank == 1:
                store.set("late", "set after the all_reduce's timeout")
elif mode == "elastic":
    from torch.distributed.elastic.utils.store import barrier, synchronize

    mine = dist.PrefixStore("mine", store)
    print(rank, "synchronized", synchronize(mine, f"r{rank}".encode(), rank, world, "sync/"), flush=True)
    barrier(mine, world, "bar/", barrier_timeout=30)
    print(rank, "passed the barrier", flush=True)
elif mode == "elastic_missing":
    from torch.distributed.elastic.utils.store import barrier

    if rank < world - 1:
        try:
            barrier(store, world, "bar/", barrier_timeout=nums[0], rank=rank, trace_timeout=1)
        except dist.DistStoreError as e:
            print(rank, "barrier:", e, flush=True)
elif mode == "add_text":
    if rank == 0:
        store.set("t", "x")
        for call in (lambda: store.add("t", 1), lambda: store.get("t"), lambda: store.check(["t"])):
            try:
                call()
            except dist.DistError as e:
                print(rank, type(e).__name__, str(e).splitlines()[0], flush=True)
    dist.barrier()
elif mode == "own_client":
    try:
        own = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), is_master=False,
                            timeout=datetime.timedelta(seconds=1))
        if rank == 0:
            own.set("own", "rank 0's")
        dist.barrier()
        print(rank, "own client got", own.get("own"), flush=True)
    except dist.DistError as e:
        print(rank, "own client:", type(e).__name__, str(e).splitlines()[0], flush=True)
        dist.barrier()
elif mode == "late":
    import time

    if rank == 0:
        store.set_timeout(datetime.timedelta(seconds=nums[0]))
        try:
            store.get("never")
        except dist.DistStoreError:
            store.set("x", "after rank 0's timeout")
            print(rank, "adds", store.add("c", 1), flush=True)
    elif rank == 1:
        time.sleep(nums[1])
        print(rank, "checks", store.check(["x"]), "adds", store.add("c", 1), flush=True)
    dist.barrier()
elif mode == "after_destroy":
    dist.barrier()
    dist.destroy_process_group()
    store.set_timeout(datetime.timedelta(seconds=5))
    if rank == 0:
        store.set("after", "set after destroy")
    else:
        print(rank, "got", store.get("after"), flush=True)
    sys.exit(0)
dist.destroy_process_group()
