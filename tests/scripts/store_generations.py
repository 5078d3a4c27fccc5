"""The store's keys across generations of ranks: what a script's own client and the default
store see after `destroy_process_group` and init again.

    torchrun --standalone --nproc-per-node N store_generations.py reinit   # N >= 2
    python store_generations.py spawn N                                      # mp.spawn twice
    python store_generations.py own_server N                                 # the same, rank 0 serving the port itself
    python store_generations.py early N                                      # clients made before init

`reinit` (torchrun-style): every rank inits, makes its own client of MASTER_PORT, adds 1 to a
counter through the default store, rank 0 sets a key on its client and one through the
default store, a `new_group([0, 1])`; rank 0 lists the keys (`num_keys`, `list_keys`) after
init, after the group, after destroy and after init again and a second `new_group`; in the
second generation every rank reads the first's keys (through the new default store, the one
it kept, its own client) and adds to the counter again. Under torchrun the agent's one store
holds every generation's keys: the second init rewrites Gloo's under the same names.
`missing`: rank 1 leaves after generation 1, rank 0's second init times out waiting for its
Gloo address (2 s): `DistStoreError: wait timeout after 2000ms, keys: /default_pg/0//cpu//0/1`.
`spawn`: the tutorials' shape, `mp.spawn` twice at one MASTER_PORT; rank 0's init hosts a new
store each spawn, so the second spawn's client sees only its own generation's keys.
`own_server`: the same with rank 0's own TCPStore server at the port, made before init and
given to it (`store=`), a new server each spawn. `early`: ranks > 0 make their client of the
port before init, rank 0 after it; each adds 1 to a counter of its spawn.
"""
import datetime
import os
import sys
import time

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
import torch.multiprocessing as mp

PORT = 29514  # the spawn mode's own choice, as the tutorials' 12355
LONG = datetime.timedelta(seconds=20)


def keys(step, own):
    print(step, own.num_keys(), sorted(own.list_keys()), flush=True)


def reinit():
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo")
    own = dist.TCPStore(addr, port, world, is_master=False, timeout=LONG)
    c10d._get_default_store().add("count", 1)
    dist.barrier()
    if rank == 0:
        keys("init1", own)
        own.set("mine", "rank 0's own")
        c10d._get_default_store().set("dflt", "through default_pg")
    dist.barrier()  # (no peer's group key before rank 0 listed)
    dist.new_group([0, 1])
    dist.barrier()
    if rank == 0:
        keys("group1", own)
    kept = c10d._get_default_store()
    dist.destroy_process_group()
    if rank == 0:  # (a peer's second init may have begun: it rewrites Gloo's keys under their names)
        keys("destroyed", own)
    dist.init_process_group("gloo")
    dist.barrier()
    if rank == 0:
        keys("init2", own)
    dist.barrier()
    print(rank, "gen2 reads", c10d._get_default_store().get("dflt"), kept.get("dflt"), own.get("mine"),
          c10d._get_default_store().add("count", 1) > world, flush=True)
    dist.new_group([0, 1])
    dist.barrier()
    if rank == 0:
        keys("group2", own)
        print("count", c10d._get_default_store().add("count", 0), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def missing():
    """Rank 1 leaves after generation 1; rank 0 initialises again with a 2 s timeout: its wait
    for rank 1's Gloo address of generation 2 runs out (the key as torch names it)."""
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo")
    dist.barrier()
    dist.destroy_process_group()
    if rank != 0:
        time.sleep(4)
        return
    try:
        dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=2))
    except dist.DistError as e:
        print(rank, type(e).__name__, str(e).splitlines()[0], flush=True)


def spawned(rank, world, spawn):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    own = dist.TCPStore("127.0.0.1", PORT, world, is_master=False, timeout=LONG)
    _spawn_keys(rank, spawn, own)


def _spawn_keys(rank, spawn, own):
    """Rank 0 writes this spawn's key at the script's own store and lists what it sees there."""
    if rank == 0:
        own.set(f"spawn{spawn}", "rank 0's")
    dist.barrier()
    if rank == 0:
        keys(f"spawn{spawn}", own)
        print("spawn1's key", own.check(["spawn1"]), flush=True)
    dist.barrier()  # rank 0 serves until every client is done
    dist.destroy_process_group()


def own_server(rank, world, spawn):
    """The script's own store at its port, made before init (rank 0 its server), given to init."""
    own = dist.TCPStore("127.0.0.1", PORT, world, is_master=rank == 0, timeout=LONG)
    dist.init_process_group("gloo", store=own, rank=rank, world_size=world)
    _spawn_keys(rank, spawn, own)


def early(rank, world, spawn):
    """A client of the port rank 0's init will host at, made before init (ranks > 0) or after
    it (rank 0): it reaches that store on plain torch (it retries until the server is up)."""
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)
    own = None if rank == 0 else dist.TCPStore("127.0.0.1", PORT, world, is_master=False, timeout=LONG)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    own = own or dist.TCPStore("127.0.0.1", PORT, world, is_master=False, timeout=LONG)
    own.add(f"n{spawn}", 1)
    dist.barrier()
    print(rank, f"n{spawn}", own.add(f"n{spawn}", 0), own.port, own.check(["n1"]), flush=True)
    dist.barrier()  # rank 0 serves until every client is done
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "reinit":
        reinit()
    elif sys.argv[1] == "missing":
        missing()
    else:
        n = int(sys.argv[2])
        for spawn in (1, 2):
            mp.spawn({"spawn": spawned, "own_server": own_server, "early": early}[sys.argv[1]], args=(n, spawn), nprocs=n)
