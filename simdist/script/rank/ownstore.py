"""A script's own `TCPStore` client of torchrun's store address, on both sides.

Under torchrun (`TORCHELASTIC_USE_AGENT_STORE=True`) the agent hosts a TCPStore at
MASTER_ADDR:MASTER_PORT and every worker's default store is a client of it, so a script's
own `dist.TCPStore(MASTER_ADDR, MASTER_PORT, world_size, is_master=False)` (or a
`PrefixStore` over one, or torch elastic's `create_c10d_store`) reaches the same server:
its raw keys sit beside torch's (`default_pg/...`, Gloo's addresses). With `is_master=True`
the bind fails and torch, seeing the variable, logs the error and goes on as a client
(measured on torch 2.13 under torchrun: "The server socket on <port> has failed to bind.
TORCHELASTIC_USE_AGENT_STORE is enabled so ignoring the error.").

simdist shows the ranks torchrun's MASTER_PORT while nothing listens there
(`simdist.script.launch.TORCHRUN_PORT`), so such a client is routed:

* on real Gloo (`env.GLOO`) to the launcher's store (`env.STORE`, the agent's stand-in): a
  real TCPStore client of it, showing the address the script named (`host`, `port`);
* in the simulator to the shared store the coordinator holds (`rank.simstore.SimStore`,
  without the default store's prefix), with the timeout the script gives.

Without torchrun (`mp.spawn`, the tutorials' env://) rank 0's init hosts the store at the port
the script named, and a client of that port made after init reaches it on plain torch; both
sides serve that store elsewhere (the real side's `env.HOST_PORT`, the simulator's shared
store), so such a client is routed the same way (`hosted`).

A client of any other port is torch's own `TCPStore`: a rank that hosts a second server
(`is_master=True` on a port of its own) serves its peers for real, the simulated ranks being
processes of this host too (its waits then take wall time, not simulated time). MASTER_PORT + 1
.. + `launch.NEAR_PORTS` (NVIDIA's in-process restart and NeMo host a store at MASTER_PORT + 1)
are the run's own ports (`env.PORT_MAP`), shown as the script named them.
"""

from __future__ import annotations

import multiprocessing
import operator
import os
import sys
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from simdist.script import env
from simdist.script.rank import simstore
from simdist.script.rank.simstore import TCP_TIMEOUT, SimTCPStore
from simdist.script.stores import AGENT_STORE, BIND_IGNORED

_TORCH_TCPSTORE = dist.TCPStore
_TORCH_PREFIXSTORE = dist.PrefixStore


def agent_port() -> int | None:
    """The port torchrun's agent serves its store at (MASTER_PORT), or None where no agent
    hosts one (a script that starts its own ranks: its MASTER_PORT is its own to serve)."""
    if os.environ.get(AGENT_STORE) != "True":
        return None
    try:
        return int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        return None


def _port(port: Any) -> int | None:
    """`port` as torch's binding takes it (an int, or what has `__index__`: not a str, which
    torch refuses with a TypeError), or None."""
    try:
        return operator.index(port)
    except TypeError:
        return None


_HOSTED: dict[str, int] = {}  # "port": the port the rank's latest init named where rank 0 hosts the store (`hosted`)


def hosted(at: tuple[str, int] | None) -> None:
    """Note where this rank's init has rank 0 host the store (`stores.rank0_hosts`: env:// or a
    tcp:// URL without torchrun's agent, the tutorials' `mp.spawn`), so that a script's own
    client of that port, made after init, reaches it as on plain torch: both sides serve that
    store at an address of the run's own (the real side's `env.HOST_PORT`, the simulator's
    shared store), not at the port the script named."""
    if at is not None:
        _HOSTED["port"] = int(at[1])


def _serving(port: Any) -> str | None:
    """Which stand-in serves a client of `port`: the launcher's store (`env.STORE`, for
    torchrun's agent's), the run's rank-0-hosted store (`env.HOST_PORT`), or None (torch's own)."""
    asked = _port(port)
    if asked is None:
        return None
    if asked == agent_port():
        return env.STORE
    return env.HOST_PORT if asked is not None and asked in (_HOSTED.get("port"), _ahead()) else None


def _ahead() -> int | None:
    """In a rank process the script started itself (`mp.spawn`'s child, no agent) before any
    init hosted a store: MASTER_PORT as the script set it, where rank 0's init will host the
    store, or rank 0 serves its own (`TCPStore(..., is_master=rank == 0)`, given to init as
    `store=`). A client made there before init reaches it on plain torch (measured: `python
    tests/scripts/store_generations.py early 3`), so it is routed as one made after init; a
    server there is the run's (`env.HOST_PORT` on the real side, the simulator's shared store),
    and init given it meets at a store of its generation's own (`hosts_own`). Not in the
    script's main process: a store it makes serves its children for real, as before."""
    if "port" in _HOSTED or os.environ.get(AGENT_STORE) == "True" or multiprocessing.parent_process() is None:
        return None
    try:
        return int(os.environ["MASTER_PORT"])
    except (KeyError, ValueError):
        return None


def hosts_own(store: Any) -> bool:
    """Whether init's `store=` is the run's stand-in for a server rank 0 made at MASTER_PORT
    (`_ahead`): its keys are the generation's own, as a store rank 0's init hosts."""
    while isinstance(store, (_TORCH_PREFIXSTORE, simstore.SimPrefixStore)):
        store = store.underlying_store
    return isinstance(store, (_Shown, SimTCPStore)) and store.port == _ahead()



class _Shown(_TORCH_TCPSTORE):  # type: ignore[misc,valid-type]
    """A real TCPStore at `at` (host, port), showing the address the script named. `client`:
    always a client (the launcher's store stands in for the agent's: with `is_master=True`
    torch's bind of MASTER_PORT fails under torchrun and is ignored, its check comparing the
    port with MASTER_PORT, which the launcher's is not)."""

    def __init__(self, at: tuple[str, int], client: bool, host_name: str, port: int, world_size: int | None = None,
                 is_master: bool = False, timeout: timedelta = TCP_TIMEOUT, wait_for_workers: bool = True,
                 multi_tenant: bool = False, master_listen_fd: int | None = None, use_libuv: bool = True) -> None:
        try:
            super().__init__(at[0], at[1], world_size, is_master and not client, timeout, wait_for_workers, multi_tenant,
                             master_listen_fd, use_libuv)
        except dist.DistNetworkError as e:  # (a connect that gave up names the address the script gave, as on torch)
            raise type(e)(str(e).replace(f"({at[0]}, {at[1]})", f"({host_name}, {port})")) from None
        self._at, self._shown = at, (host_name, int(port))
        simstore.keep(self)  # once only C++ holds it (a PrefixStore's), pybind would hand out a bare TCPStore

    def clone(self) -> _Shown:
        """A connection of its own to the same server, showing the same address (torch's clone
        is a client of the address it reached: the stand-in's, not the script's)."""
        return _Shown(self._at, True, *self._shown, None, timeout=self.timeout, use_libuv=self.libuvBackend)

    @property
    def host(self) -> str:
        return self._shown[0]

    @property
    def port(self) -> int:
        return self._shown[1]


simstore.named_as(_Shown, _TORCH_TCPSTORE)


def shown(at: tuple[str, int], named: tuple[str, int], world_size: int, timeout: timedelta) -> Any:
    """A real client of the store at `at` showing the address `named`: the base of the real
    side's default store (`rank.patches._launcher_store`), as torchrun's env:// client of the
    agent's store shows MASTER_ADDR:MASTER_PORT (what a script that walks `underlying_store`
    finds, on both sides: `simstore.default_store`)."""
    return _Shown(at, True, named[0], named[1], world_size, False, timeout)


def of_agent(store: Any) -> bool:
    """Whether `store` reaches the real side's stand-in for torchrun's agent store (`env.STORE`):
    the default store it makes, or a script's own client of MASTER_PORT given to init. Those
    keys outlive a generation of ranks, as the agent's do (`rank.genkeys`)."""
    while isinstance(store, _TORCH_PREFIXSTORE):
        store = store.underlying_store
    return isinstance(store, _TORCH_TCPSTORE) and env.STORE in os.environ and (
        (store._at if isinstance(store, _Shown) else (store.host, store.port)) == _address(env.STORE))


def _address(var: str) -> tuple[str, int]:
    host, port = os.environ[var].rsplit(":", 1)
    return host, int(port)


def near_port(port: Any) -> int | None:
    """The run's own port for MASTER_PORT + k (`env.PORT_MAP`, `launch.near_ports`), or None."""
    asked = _port(port)
    for pair in os.environ.get(env.PORT_MAP, "").split(","):
        shown, _, real = pair.partition(":")
        if real and asked is not None and int(shown) == asked:
            return int(real)
    return None


class _AnyClient(type(_TORCH_TCPSTORE)):  # type: ignore[misc]
    """`isinstance(store, dist.TCPStore)` stays true for torch's stores and the routed ones."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, (_TORCH_TCPSTORE, SimTCPStore))

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, (_TORCH_TCPSTORE, SimTCPStore))


def _bind_ignored(port: int, args: tuple, kwargs: dict[str, Any]) -> None:
    """What torch logs on stderr for a client of MASTER_PORT made with `is_master=True` under
    torchrun (its bind fails, the agent holds the port), as C++ logs it: measured on torch 2.13,
    `[E1125 00:32:00.319428895 TCPStore.cpp:277] [c10d] The server socket on 38089 has ...`,
    after init with c10's `[rank<r>]:` in front."""
    if not kwargs.get("is_master", args[1] if len(args) > 1 else False):
        return
    ns = time.time_ns()
    prefix = f"[rank{dist.get_rank()}]:" if dist.is_initialized() else ""
    stamp = time.strftime("%m%d %H:%M:%S", time.localtime(ns // 10**9)) + f".{ns % 10**9:09d}"
    sys.stderr.flush()
    os.write(2, f"{prefix}[E{stamp} {BIND_IGNORED.format(port)}\n".encode())


def _factory(mode: str) -> type:
    """What `dist.TCPStore` is in a rank of `mode`: torch's class, except for the ports `_serving`
    and `near_port` name.
    Its `__new__` returns a finished store (torch's or a routed one), never an instance of
    itself, so Python calls no `__init__` after it."""

    class TCPStore(_TORCH_TCPSTORE, metaclass=_AnyClient):  # type: ignore[misc,valid-type]
        __doc__ = _TORCH_TCPSTORE.__doc__

        def __new__(cls, host_name: Any, port: Any, *args: Any, **kwargs: Any) -> Any:
            served = _serving(port)
            if served == env.STORE:
                _bind_ignored(int(port), args, kwargs)
            if served is not None and mode != env.GLOO:
                return simstore.routed("agent" if served == env.STORE else "hosted", host_name, port, *args, **kwargs)
            if served is not None and served in os.environ:  # (a server only ahead of init: `_ahead`)
                server = served == env.HOST_PORT and "port" not in _HOSTED and kwargs.get(
                    "is_master", args[1] if len(args) > 1 else False)
                return _Shown(_address(served), not server, host_name, port, *args, **kwargs)
            if (near := near_port(port)) is not None:
                return _Shown((host_name, near), False, host_name, port, *args, **kwargs)
            return _TORCH_TCPSTORE(host_name, port, *args, **kwargs)

    simstore.named_as(TCPStore, _TORCH_TCPSTORE)
    return TCPStore


class _AnyPrefix(type(_TORCH_PREFIXSTORE)):  # type: ignore[misc]
    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, (_TORCH_PREFIXSTORE, simstore.SimPrefixStore))

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, (_TORCH_PREFIXSTORE, simstore.SimPrefixStore))


class PrefixStore(_TORCH_PREFIXSTORE, metaclass=_AnyPrefix):  # type: ignore[misc,valid-type]
    """torch's `PrefixStore`, in Python over a simulated store (`simstore.SimPrefixStore`:
    with the queues and `list_keys` a C++ one over a Python store lacks)."""

    __doc__ = _TORCH_PREFIXSTORE.__doc__

    def __new__(cls, prefix: Any, store: Any) -> Any:
        if isinstance(store, (simstore.SimStore, simstore.SimPrefixStore)):
            return simstore.SimPrefixStore(prefix, store)
        return _TORCH_PREFIXSTORE(prefix, store)


simstore.named_as(PrefixStore, _TORCH_PREFIXSTORE)


def install(mode: str) -> None:
    """Route a script's own clients of MASTER_PORT (`dist.TCPStore` as the script reaches it:
    `torch.distributed.TCPStore`, `from torch.distributed import TCPStore` after this, and the
    one torch's env:// rendezvous makes, `next(dist.rendezvous("env://"))`); in the
    simulator, `PrefixStore` over a simulated store (the script's, and torch's own over the
    default store: `c10d._get_default_store()` is one) is `simstore.SimPrefixStore`."""
    # (`torch.distributed.rendezvous` the module: `dist.rendezvous` is its function of that name)
    dist.TCPStore = sys.modules["torch.distributed.rendezvous"].TCPStore = _factory(mode)  # type: ignore[misc]
    if mode != env.GLOO:
        dist.PrefixStore = c10d.PrefixStore = PrefixStore  # type: ignore[misc]
