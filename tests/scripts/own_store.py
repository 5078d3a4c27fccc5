"""A script's own TCPStore client of torchrun's store (MASTER_ADDR, MASTER_PORT), as real code
makes one for its own coordination: under torchrun the agent serves that address and the
workers' default store is a client of it too.

    python own_store.py MODE [ARG]   # torchrun-style, 2 ranks or more

`client`: each rank makes a client (is_master=False) after init; rank 0 sets a key, a barrier,
every rank gets it, adds to a counter, and reads a key rank 0 set through the default store
(`default_pg/0//<key>` on the raw client); `master`: the same with is_master=(rank == 0)
(torchrun's agent already holds the port: torch logs the failed bind and goes on as a
client); `before_init`: the client is made before init and handed to it as `store=`; ranks
exchange through it after; `timeout`: the client's timeout is 1 s and the last rank gets a key
nobody sets; `prefix`: a `PrefixStore` over the client: set/get, compare_set, delete_key,
check, list_keys (its own keys), the queue operations, `num_keys` (the server's count);
`next_port`: rank 0 hosts a second store on MASTER_PORT + 1 (as NVIDIA's in-process restart
and NeMo do), every rank a client, each sets a key and waits for all; `groups`: two new groups, then rank 0 lists the keys (Gloo's addresses of each group);
`second_port`: rank 0 hosts a TCPStore of its own on a free port, tells the others the port
through the default store, and they become its clients; `apart`: what a script sees of its
client's class (names, `issubclass`, a `PrefixStore`'s), a client made without a world size
counting the keys (TCPStore's count of its workers is there since init), a port given as a
str (torch's TypeError), and an `add` on a value that is no number, which closes that
client's connection only: the rank's default store, its other client and a clone made before
(its timeout copied, not shared) go on working;
the default store's timeout (torch's 30 minutes when init is given none) and its base, a
TCPStore showing MASTER_ADDR:MASTER_PORT.
"""
import datetime
import os
import sys

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

mode = sys.argv[1]
addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
second = datetime.timedelta(seconds=1)


def say(*words):
    print(rank, *words, flush=True)


if mode == "before_init":
    own = dist.TCPStore(addr, port, world, is_master=False, timeout=datetime.timedelta(seconds=20))
    dist.init_process_group("gloo", store=own, rank=rank, world_size=world)
    say("store is own:", c10d._get_default_store().underlying_store is own)
    own.add("joined", 1)
    dist.barrier()
    say("joined", own.get("joined"), "port", own.port)
    dist.destroy_process_group()
    sys.exit(0)

dist.init_process_group("gloo")
if mode in ("client", "master"):
    own = dist.TCPStore(addr, port, world, is_master=mode == "master" and rank == 0,
                        timeout=datetime.timedelta(seconds=20))
    say("own", type(own).__name__, isinstance(own, dist.TCPStore), own.host == addr, own.port == port)
    if rank == 0:
        own.set("note", "rank 0's own")
        c10d._get_default_store().set("via_default", "through default_pg")
    dist.barrier()
    own.add("count", rank + 1)  # (what it returns depends on who came first: a race on real Gloo)
    say("got", own.get("note"), own.get("default_pg/0//via_default"))
    dist.barrier()
    say("count", own.add("count", 0))
elif mode == "timeout":
    dist.barrier()  # every rank's Gloo mesh is up before the first leaves (its exit would break a peer's connect)
    own = dist.TCPStore(addr, port, world, is_master=False, timeout=second)
    if rank == world - 1:
        own.get("never")  # its timeout ends it
elif mode == "prefix":
    own = dist.PrefixStore("mine", dist.TCPStore(addr, port, world, is_master=False, timeout=second))
    if rank == 0:
        own.set("a", "1")
        say("cs", own.compare_set("a", "1", "2"), own.compare_set("b", "", "new"), own.get("a"))
        say("delete", own.delete_key("b"), own.delete_key("b"), "check", own.check(["a"]), own.check(["b"]))
        say("list", sorted(own.list_keys()), "raw", sorted(own.underlying_store.list_keys()))
        say("num_keys", own.num_keys(), own.underlying_store.num_keys())
        own.queue_push("q", "x")
        own.queue_push("q", b"y")
        say("queue", own.queue_len("q"), own.check(["q"]), own.queue_pop("q"), own.queue_len("q"))
        say("pop", own.queue_pop("q", block=False), own.check(["q"]), own.queue_len("q"), own.queue_len("nope"))
        own.queue_push("a", "in a queue")
        say("key and queue apart", own.get("a"), own.queue_len("a"), sorted(own.list_keys()))
        for block in (False, True):
            try:
                own.queue_pop("q", block=block)
            except dist.DistError as e:
                say("empty", block, type(e).__name__, str(e))
    dist.barrier()
    if rank == world - 1:
        say("popped", own.queue_pop("a"), "list", sorted(own.list_keys()))
    dist.barrier()
    if rank == 0:
        own.queue_push("later", "for the last rank")
    if rank == world - 1:
        say("waited", own.queue_pop("later"))
elif mode == "next_port":  # NVIDIA resiliency / NeMo's coordination store: rank 0 serves MASTER_PORT + 1
    own = dist.TCPStore(host_name=addr, port=port + 1, world_size=world, is_master=rank == 0, multi_tenant=True,
                        wait_for_workers=True, use_libuv=True, timeout=datetime.timedelta(seconds=20))
    own.set(f"r{rank}", str(rank))
    own.wait([f"r{r}" for r in range(world)])
    say("next", own.port == port + 1, own.num_keys(), sorted(own.list_keys()))
    dist.barrier()  # rank 0 serves until every client is done
elif mode == "groups":  # the keys Gloo's rendezvous leaves for each group a rank makes
    own = dist.TCPStore(addr, port, world, is_master=False)
    pair = dist.new_group([0, 1])
    mine = dist.new_group([rank], use_local_synchronization=True)
    dist.barrier()
    if rank == 0:
        say("keys", own.num_keys(), sorted(own.list_keys()))
        say("default", c10d._get_default_store().num_keys(), sorted(c10d._get_default_store().list_keys()))
elif mode == "second_port":  # rank 0 serves on a free port and tells the others through the default store
    if rank == 0:
        own = dist.TCPStore(addr, 0, world, is_master=True, wait_for_workers=False, timeout=datetime.timedelta(seconds=20))
        c10d._get_default_store().set("second_port", str(own.port))
        own.set("k", "on rank 0's server")
    else:
        at = int(c10d._get_default_store().get("second_port"))
        own = dist.TCPStore(addr, at, world, is_master=False, timeout=datetime.timedelta(seconds=20))
    say("second", own.get("k"), own.add("n", 1) <= world)
    dist.barrier()
    say("n", own.add("n", 0))
    dist.barrier()  # rank 0 serves until every client is done (its exit would end the server)
elif mode == "apart":  # each client is a connection of its own; what the classes say
    dist.barrier()  # every rank's Gloo address is in the store
    own = dist.TCPStore(addr, port, timeout=second)  # no world size: it does not count itself in
    other = dist.TCPStore(addr, port, world, is_master=False, timeout=second)
    kind, pre = type(own), type(dist.PrefixStore("p", own))
    say("class", kind.__name__, kind.__module__, issubclass(kind, dist.TCPStore), pre.__name__, pre.__module__)
    say("num_keys", own.num_keys(), "default's timeout", c10d._get_default_store().timeout)
    base = c10d._get_default_store()
    while hasattr(base, "underlying_store"):
        base = base.underlying_store
    say("default's base", type(base).__name__, isinstance(base, dist.TCPStore), base.host == addr, base.port == port)
    try:
        dist.TCPStore(addr, str(port), timeout=second)
    except TypeError:
        say("a str port: TypeError")
    dist.barrier()
    if rank == 0:
        twin = own.clone()  # a connection of its own, the timeout copied
        own.set_timeout(2 * second)
        own.set("n", "no number")
        for call in (lambda: own.add("n", 1), lambda: own.get("n"), lambda: own.get("n")):
            try:
                call()
            except dist.DistError as e:
                say("own", type(e).__name__, str(e).split(".")[0])
        c10d._get_default_store().set("still", "up")
        say("default", c10d._get_default_store().get("still"), "other", other.get("n"))
        say("clone", type(twin).__name__, twin.get("n"), twin.timeout, twin.port == port)
    dist.barrier()
dist.destroy_process_group()
