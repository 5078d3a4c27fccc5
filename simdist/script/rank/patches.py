"""`init_process_group` and group creation, redirected to the simulated backend (or to Gloo).

Whatever backend the script names (`nccl`, `gloo`, `"cpu:gloo,cuda:nccl"`, None), its groups
run on `simdist`; no TCP rendezvous happens (MASTER_ADDR/PORT and `init_method` only
supply the rank and world size, as `env://` and `tcp://...?rank=` URLs do), and the rank
registers with the coordinator before torch builds the default group. Every later group
(`new_group`, whatever backend it names) is made by the same creator. In the "gloo" mode the
groups are real Gloo ones and the ranks meet at the launcher's loopback store (torchrun's
agent store), or, under env:// and tcp://, at the store rank 0 hosts (`simdist.script.stores`). In the
simulator, `torch.distributed.rpc.init_rpc` is refused as not modelled (`_refuse_rpc`).
"""

from __future__ import annotations

import functools
import inspect
import linecache
import numbers
import os
import sys
import time
from datetime import timedelta
from typing import Any
from urllib.parse import urlparse

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d
from torch.distributed.rendezvous import _query_to_dict

from simdist.script import env
from simdist.script.rank import (
    backend,
    client,
    cpu_node,
    exits,
    genkeys,
    output,
    ownstore,
    pg,
    simstore,
    stack,
    timedwait,
    work,
)
from simdist.script.stores import rank0_hosts, store_address


def rank_and_size(rank: Any, world_size: Any, init_method: str | None, store_given: bool = False) -> tuple[int, int]:
    """The rank and world size as torch 2.13's init finds them, with its errors, word for word
    (`init_process_group`'s store checks; `torch.distributed.rendezvous.rendezvous`,
    `_rendezvous_helper` and the env://, tcp:// and file:// handlers): a script run without
    the variables torchrun sets reads what it would read under torch."""
    if store_given:
        if not world_size > 0:
            raise AssertionError("world_size must be positive if using store")
        if not rank >= 0:
            raise AssertionError("rank must be non-negative if using store")
        return rank, world_size
    url = init_method or "env://"
    if not isinstance(rank, numbers.Integral):
        raise RuntimeError(f"`rank` must be an integer. {rank}")
    if not isinstance(world_size, numbers.Integral):
        raise RuntimeError(f"`world_size` must be an integer. {world_size}")
    parsed = urlparse(url)
    query = _query_to_dict(parsed.query)
    if (rank != -1 or world_size != -1) and ("rank" in query or "world_size" in query):
        raise AssertionError(f"The url: {url} has node-specific arguments(rank, world_size) already.")
    if rank != -1:
        query["rank"] = str(rank)
    if world_size != -1:
        query["world_size"] = str(world_size)
    scheme = parsed.scheme
    if scheme not in ("env", "tcp", "file"):
        raise RuntimeError(f"No rendezvous handler for {scheme}://")

    def error(msg: str) -> ValueError:
        return ValueError(f"Error initializing torch.distributed using {scheme}:// rendezvous: {msg}")

    if scheme == "env":
        def read(key: str, var: str) -> int:
            if key in query:
                return int(query[key])
            if not os.environ.get(var):
                raise error(f"environment variable {var} expected, but not set")
            return int(os.environ[var])

        return read("rank", "RANK"), read("world_size", "WORLD_SIZE")
    if scheme == "tcp" and parsed.port is None:
        raise error("port number missing")
    if scheme == "file" and not parsed.path:
        raise error("path missing")
    if "rank" not in query:
        raise error("rank parameter missing")
    if "world_size" not in query:
        raise error("world size parameter missing")
    return int(query["rank"]), int(query["world_size"])


def _patch_init(backend: str) -> None:
    orig = c10d.init_process_group
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def init_process_group(*args: Any, **kwargs: Any) -> None:
        if dist.is_initialized():  # torch's own error: "trying to initialize the default process group twice!"
            return orig(*args, **kwargs)
        try:  # torch's own errors before any world is joined: the process called init, which raised
            bound = sig.bind(*args, **kwargs)
            a = bound.arguments
            rank, world_size = rank_and_size(a.get("rank", -1), a.get("world_size", -1), a.get("init_method"),
                                             a.get("store") is not None)
            # (before anything: torch's rendezvous raises for an address it cannot read, e.g. no MASTER_ADDR)
            host = rank0_hosts(a.get("init_method"), a.get("store") is not None, os.environ)
        except Exception:
            exits.init_raised()
            raise
        ownstore.hosted(host)  # a script's own client of that port reaches that store
        at = time.time() if client.CLIENT is None else None  # its process's first init (`rendezvous`)
        c = client.connect(os.environ[env.SOCKET])
        limit = a.get("timeout")
        # simulated: the coordinator is the rendezvous (`simdist.script.rendezvous`), so the
        # reply comes once the whole world has joined, or with the store's error
        reply = c.request({"t": "init", "rank": rank, "world_size": world_size, "pid": os.getpid(),
                           "backend": str(a.get("backend")), "cpu": time.thread_time(),
                           "to": limit.total_seconds() if limit is not None else None,
                           "at": at, "frames": stack.caller_stack(1), "host": host,
                           "own": ownstore.hosts_own(a.get("store")), "spawn": exits.spawn_index()})  # (rank 0's own server: the generation's keys)
        if reply.get("error"):
            raise RuntimeError(f"simdist: {reply['error']}")
        c.rank = rank
        c.began(int(reply.get("gen") or 1))
        c.semantics = reply.get("backend") or c.semantics
        exits.registered(sys._getframe(1))
        output.registered()
        if reply.get("raise"):  # what real Gloo's rendezvous raises there (`simdist.script.rendezvous`)
            kind, message = reply["raise"]
            raise getattr(dist, kind, RuntimeError)(message)  # DistStoreError, DistNetworkError
        cpu_node.check_backend(a.get("backend"))  # a CPU-only node's torch has no NCCL
        for name in ("device_id", "pg_options"):
            a.pop(name, None)
        url = a.get("init_method")  # the script's, read before the updates below clear it
        if backend == pg.BACKEND_NAME:
            a.update(backend=backend, init_method=None, rank=rank, world_size=world_size)
            if a.get("store") is None:  # the store the generation's ranks share (`simdist.script.keystore`)
                a["store"] = simstore.default_store(limit, store_address(url, os.environ), world_size)
        elif host is not None:  # rank 0 hosts the store, as the script's env:// or tcp:// has it, on 127.0.0.1
            a.update(backend=backend, rank=rank, world_size=world_size,
                     init_method=f"tcp://{os.environ[env.HOST_PORT]}")
        else:  # real ranks meet at the launcher's loopback store (torchrun's agent's), whatever address the script names
            a.update(backend=backend, init_method=None, rank=rank, world_size=world_size)
            if a.get("store") is None:
                a["store"] = _launcher_store(world_size, a.get("timeout"), store_address(url, os.environ))
        if backend == "gloo":  # every generation at the launcher's store shares its keys, as on torchrun (`genkeys`)
            genkeys.shared(c.generation if host is None and ownstore.of_agent(a["store"]) else None)
        orig(*bound.args, **bound.kwargs)

    c10d.init_process_group = init_process_group
    dist.init_process_group = init_process_group
    _rebind_imported(orig, init_process_group)  # `init_device_mesh` initialises through its own name


def _rebind_imported(orig: Any, new: Any) -> None:
    """Point torch's modules that imported `orig` by name (`from ... import name`) at `new`:
    patching the defining module alone leaves them calling the original (device_mesh, imported
    with torch, holds `init_process_group` and `get_backend` so)."""
    name = orig.__name__
    for module_name, module in list(sys.modules.items()):
        if module_name.startswith("torch") and vars(module).get(name) is orig:
            setattr(module, name, new)


def _launcher_store(world_size: int, timeout: Any, shown: tuple[str, int] | None) -> dist.Store:
    """A client of the store the launcher hosts on 127.0.0.1 (`simdist.script.launch`) under
    torch's `PrefixStore("default_pg", ...)`, as torchrun's env:// rendezvous gives it: the
    keys are torchrun's (`default_pg/0//cpu//0/1`, in errors and beside a script's own client
    of MASTER_PORT, `rank.ownstore`) in every generation of ranks, one key space as torchrun's
    agent store is (`rank.genkeys`: each generation's Gloo rendezvous still meets its own
    addresses). Its base shows `shown`, the address init read (MASTER_ADDR:MASTER_PORT under
    torchrun), where there is one."""
    host, port = os.environ[env.STORE].rsplit(":", 1)
    # init's timeout, else torch's default (init sets it on the store it makes, not on one it is given)
    limit = timeout if timeout is not None else c10d.default_pg_timeout
    store = (dist.TCPStore(host, int(port), world_size, is_master=False, timeout=limit) if shown is None
             else ownstore.shown((host, int(port)), shown, world_size, limit))
    return dist.PrefixStore("default_pg", store)


def _patch_destroy() -> None:
    """Tell the coordinator when the default group is destroyed: the rank's generation ends
    there (`simdist.script.generations`), not at its process's exit. On Gloo its peers'
    unfinished operations with it fail then ("Connection closed by peer", measured while the
    destroying process lived on), and the same process may initialise again."""
    orig = c10d.destroy_process_group

    @functools.wraps(orig)
    def destroy_process_group(group: Any = None) -> None:
        world = dist.is_initialized() and (group is None or group == c10d.GroupMember.WORLD)
        frames = stack.caller_stack(1)
        orig(group)
        c = client.CLIENT
        if world and c is not None:
            c.send({"t": "destroy", "frames": frames, "cpu": time.thread_time()})

    c10d.destroy_process_group = destroy_process_group
    dist.destroy_process_group = destroy_process_group


def _patch_store_barrier() -> None:
    """TORCH_DIST_INIT_BARRIER=1 makes init and new_group end with a barrier at the store
    (`c10d._store_based_barrier`), modelled as one wait (`simdist.script.barriers`: its
    turns, its words) rather than torch's own calls at the shared store. At init the coordinator's rendezvous is that barrier already (it
    answers the whole world at once); a group's barrier over the whole world (new_group
    without use_local_synchronization: non-members too) meets at the coordinator
    (`rendezvous.RendezvousMixin._store_barrier`); one over the members only is what the
    group's creation waited for."""

    def _store_based_barrier(rank: int, store: Any, group_name: str, rendezvous_count: int, timeout: Any,
                             logging_interval: Any = timedelta(seconds=10)) -> None:
        c = client.CLIENT
        pg_of = c10d._world.pg_names  # noqa: SLF001 (the default group's name: its init's barrier)
        default = c10d.GroupMember.WORLD
        if c is None or (default is not None and pg_of.get(default) == group_name):
            return
        if rendezvous_count >= dist.get_world_size():
            # torch's turn: it waits for the last worker's key this long, then checks its timeout
            turn = max(logging_interval, timedelta(seconds=10 + rendezvous_count / 1000))
            reply = c.request({"t": "barrier", "key": str(group_name), "count": int(rendezvous_count),
                               "to": timeout.total_seconds() if timeout < c10d.default_pg_timeout else None,
                               "turn": turn.total_seconds(), "frames": stack.caller_stack(1),
                               "cpu": time.thread_time()}, blocks=True)
            if reply.get("raise"):  # its timeout ran out (`simdist.script.barriers`)
                kind, message = reply["raise"]
                raise getattr(dist, kind, RuntimeError)(message)

    c10d._store_based_barrier = _store_based_barrier


def _patch_group_helper(backend: str) -> None:
    orig = c10d._new_process_group_helper
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def helper(*args: Any, **kwargs: Any) -> Any:
        bound = sig.bind(*args, **kwargs)
        cpu_node.check_backend(bound.arguments.get("backend"))  # new_group's (init's is checked in init)
        bound.arguments["backend"] = backend
        for name in ("device_id", "backend_options"):
            if name in bound.arguments:
                bound.arguments[name] = None
        if backend != "gloo":
            return orig(*bound.args, **bound.kwargs)
        with genkeys.creating(bound.arguments["group_name"], backend):  # (generation 2 on: its own addresses)
            return orig(*bound.args, **bound.kwargs)

    c10d._new_process_group_helper = helper


def _patch_get_backend() -> None:
    """`get_backend` names the backend whose semantics the run models ("gloo" or "nccl"), not
    `simdist`: scripts print and branch on it, and so does torch (`monitored_barrier` is
    Gloo's only, ZeRO's overlap hook refuses Gloo, autograd all_gather picks by it)."""
    orig = c10d.get_backend

    @functools.wraps(orig)
    def get_backend(group: Any = None) -> Any:
        name = orig(group)
        c = client.CLIENT
        return dist.Backend(c.semantics) if name == pg.BACKEND_NAME and c is not None else name

    # device_mesh decides by it whether a 1-D mesh gets a group of its own
    _rebind_imported(orig, get_backend)


def _refuse_rpc() -> None:
    """`torch.distributed.rpc.init_rpc` is refused as an API the simulated backend cannot model
    (RPC, RRefs, distributed autograd and optimizers run over TensorPipe, not a process group).
    Left alone, it would rendezvous for real over TCP at the script's MASTER_ADDR/PORT and run
    its remote calls outside the simulation, and a process that only calls it never becomes a
    rank, so its error would be no rank's: the process leaves the error where `execute` reads it
    (`env.refuse`), which makes the run bad input, then raises."""
    from torch.distributed import rpc

    if not rpc.is_available():  # a torch built without RPC has no init_rpc to refuse
        return
    orig = rpc.init_rpc
    sig = inspect.signature(orig)

    @functools.wraps(orig)
    def init_rpc(*args: Any, **kwargs: Any) -> None:
        what = "torch.distributed.rpc.init_rpc (RPC)"
        bound = sig.bind_partial(*args, **kwargs).arguments
        caller = stack.where(stack.innermost_user(sys._getframe(1)))
        at = "" if caller is None else (f" at {os.path.basename(caller[0])}:{caller[1]} in {caller[2]}: "
                                        f"{linecache.getline(caller[0], caller[1]).strip()}")
        error = f"script: {env.UNSUPPORTED.format(what).removeprefix('simdist: ')} (worker {bound.get('name')!r}{at})"
        rank = bound.get("rank", -1)
        rank = int(os.environ.get("RANK", -1)) if rank is None or rank < 0 else rank
        env.refuse(rank, error)
        raise pg.UnsupportedOperation(what)

    rpc.init_rpc = init_rpc


def install(mode: str) -> None:
    """`mode` "sim": every group is simulated; "gloo": every group is a real Gloo one."""
    # when a run is ended (a hang; the watchdog, a rank spinning or waiting outside any
    # collective) each live rank says where its main thread stands, on both sides alike
    client.answer_dumps(exits.snapshot)
    ownstore.install(mode)  # a script's own client of MASTER_PORT reaches the agent's store's stand-in
    if mode == env.GLOO:
        from simdist.script.rank import flight, pylog, stall

        _patch_init("gloo")
        _patch_group_helper("gloo")
        _patch_destroy()
        flight.install()
        pylog.install()
        stall.install()  # the early hang verdict's evidence (`simdist.script.stalls`)
        exits.add_to_exit(lambda: {"fr": flight.dump()})
        exits.add_to_exit(lambda: {"p2p": pylog.dump(), "args": pylog.collective_args()})
        return
    backend.register()
    _refuse_rpc()
    _patch_store_barrier()
    _patch_init(pg.BACKEND_NAME)
    _patch_destroy()
    _patch_group_helper(pg.BACKEND_NAME)
    _patch_get_backend()
    work.keep_reducer_works()  # DDP's Join hands its reducer a work it reads in C++
    timedwait.install()  # a thread in a timed wait posts nothing before its timer ends
