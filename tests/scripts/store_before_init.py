"""A store used before (or without) `init_process_group`: custom launchers and scripts that
exchange a run id or a port through their own TCPStore first.

    torchrun --standalone --nproc-per-node N store_before_init.py MODE   # N >= 2
    python store_before_init.py spawn MODE N                               # mp.spawn, rank 0 serves the port

torchrun-style MODEs: `exchange`: before init each rank makes its own client of MASTER_PORT
(`is_master=rank == 0`, as custom launchers write it; torchrun's agent holds the port), rank 0
sets a run id, every rank gets it, adds to a counter and waits for every rank's key.
`rendezvous`: the same through the store torch's env:// rendezvous makes
(`next(dist.rendezvous("env://"))`). `timeout`: the last rank gets a key nobody sets with the
client's 1 s timeout, then waits for two with 0.5 s. Then each inits, and a barrier. `cost`:
500 set + get of a rank's own keys before init: the time a call takes.
spawn MODEs (`mp.spawn`, rank 0's own `TCPStore(..., is_master=True)` at the script's port,
waiting for its workers): `server`: the workers come 1 s after rank 0 began serving; every rank exchanges a key
before init, then init with the store; `missing`: the last worker never makes its client:
rank 0's server times out waiting for clients (its timeout 1 s), then every rank inits (at a
file); `noserver`: rank 0 never makes its server, each worker's client gives up
connecting."""
import datetime
import glob
import os
import sys
import tempfile
import time

import torch.distributed as dist
import torch.multiprocessing as mp

PORT = 29516  # the spawn modes' own choice, as the tutorials' 12355
LONG = datetime.timedelta(seconds=20)


def say(rank, *words):
    print(rank, *words, flush=True)


def exchange(store, rank, world):
    if rank == 0:
        store.set("run_id", "run-42")
    say(rank, "run id", store.get("run_id"))
    store.add("arrived", 1)
    store.set(f"r{rank}", str(rank))
    store.wait([f"r{r}" for r in range(world)])
    say(rank, "arrived", store.add("arrived", 0), "check", store.check(["run_id", "nope"]))


def torchrun(mode):
    addr, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if mode == "cost":  # what a call before init costs: 500 set + get of the rank's own keys
        own = dist.TCPStore(addr, port, world, is_master=False, timeout=LONG)
        t = time.perf_counter()
        for i in range(500):
            own.set(f"{rank}/{i}", "x")
            own.get(f"{rank}/{i}")
        say(rank, "ms a call", round((time.perf_counter() - t) / 1000 * 1000, 3))
    elif mode == "rendezvous":
        own, r, w = next(dist.rendezvous("env://"))
        say(rank, "rendezvous", r, w, type(own).__name__)
    else:
        timeout = datetime.timedelta(seconds=1) if mode == "timeout" else LONG
        own = dist.TCPStore(addr, port, world, is_master=rank == 0, timeout=timeout)
    if mode == "timeout" and rank == world - 1:
        for call in (lambda: own.get("never"), lambda: own.wait(["never", "nor"], datetime.timedelta(seconds=0.5))):
            t = time.monotonic()
            try:
                call()
            except dist.DistError as e:
                say(rank, type(e).__name__, str(e), "in time", 0.45 <= time.monotonic() - t)
    elif mode not in ("timeout", "cost"):
        exchange(own, rank, world)
    dist.init_process_group("gloo")
    dist.barrier()
    say(rank, "after init", own.check(["run_id"]), own.num_keys())
    dist.destroy_process_group()


def flag(run, name):
    """A file the spawned ranks of run `run` tell each other a step by (beside the store under test)."""
    return os.path.join(tempfile.gettempdir(), f"store_before_init.{run}.{name}")


def await_flag(run, name):
    while not os.path.exists(flag(run, name)):
        time.sleep(0.01)


def spawned(rank, world, mode, run):
    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(PORT)  # (as the tutorials set them)
    if mode in ("missing", "noserver"):
        missing(rank, world, run) if mode == "missing" else noserver(rank, world, run)
        return
    t = time.monotonic()
    if rank == 0:
        open(flag(run, "serving"), "w").close()
    else:  # the workers come 1 s after rank 0 began serving
        await_flag(run, "serving")
        time.sleep(1)
    own = dist.TCPStore("127.0.0.1", PORT, world, is_master=rank == 0, timeout=LONG)
    if rank == 0:
        say(rank, "server waited for its workers", time.monotonic() - t >= 0.9)
    exchange(own, rank, world)
    dist.init_process_group("gloo", store=own, rank=rank, world_size=world)
    dist.barrier()
    dist.destroy_process_group()


def noserver(rank, world, run):
    """Rank 0 never makes its server: each worker's client gives up connecting (its timeout 1 s;
    torch's retries take about twice that); then every rank inits at a file of its own."""
    if rank == 0:
        time.sleep(3)
    else:
        t = time.monotonic()
        try:
            dist.TCPStore("127.0.0.1", PORT, world, is_master=False, timeout=datetime.timedelta(seconds=1))
        except dist.DistError as e:
            say(rank, type(e).__name__, str(e), "after its timeout", 0.95 <= time.monotonic() - t)
    dist.init_process_group("gloo", init_method=f"file://{flag(run, 'init')}", rank=rank, world_size=world)
    dist.barrier()
    dist.destroy_process_group()


def missing(rank, world, run):
    """The last worker never makes its client: rank 0's server gives up (after every other
    worker is on its way to connect); then every rank meets at an init of its own (file://: a
    tcp:// one would be served where the failed server was on simdist's real side) and a barrier."""
    if rank == world - 1:
        time.sleep(3)
    else:
        if rank == 0:
            for r in range(1, world - 1):
                await_flag(run, f"client{r}")
        else:
            open(flag(run, f"client{rank}"), "w").close()
        t = time.monotonic()
        try:
            dist.TCPStore("127.0.0.1", PORT, world, is_master=rank == 0, timeout=datetime.timedelta(seconds=1))
        except dist.DistError as e:
            say(rank, type(e).__name__, str(e), "after 2 s", 1.9 <= time.monotonic() - t)
    dist.init_process_group("gloo", init_method=f"file://{flag(run, 'init')}", rank=rank, world_size=world)
    dist.barrier()
    dist.destroy_process_group()


if __name__ == "__main__":
    if sys.argv[1] == "spawn":
        run = f"{os.getpid()}-{time.time_ns()}"
        try:
            mp.spawn(spawned, args=(int(sys.argv[3]), sys.argv[2], run), nprocs=int(sys.argv[3]))
        finally:
            for name in glob.glob(flag(run, "*")):
                os.remove(name)
    else:
        torchrun(sys.argv[1])
