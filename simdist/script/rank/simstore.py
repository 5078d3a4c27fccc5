"""The simulated ranks' default store: a `dist.Store` whose keys the coordinator holds.

A local `HashStore` per rank was all torch's own code needs, but a script that exchanges its
own data through the default store (`c10d._get_default_store()`, torch elastic's
`store.barrier`, `add` counters, `compare_set` elections) then waits for good where real
Gloo gives it the value. Each operation goes to the coordinator (`simdist.script.keystore`),
which holds one store per generation on the simulated clock and parks a rank whose `get`,
`wait` or `multi_get` finds its keys missing, until a peer writes them or the store's timeout
ends the wait with TCPStore's words.

torch calls a Python subclass of `dist.Store` through its trampoline (PythonStore in
torch/csrc/distributed/c10d/init.cpp): by the Python names for `set`, `get`, `add`, `check`,
`wait`, `compare_set`, `append`, `multi_get`, `multi_set`, but by the C++ names for
`deleteKey` and `getNumKeys` (measured on torch 2.13: a subclass without them raises "Tried
to call pure virtual function"). The timeout is the base class's (`set_timeout`, through a
`PrefixStore` too). Values travel as latin-1 text (any bytes, losslessly) in the JSON header.
"""

from __future__ import annotations

import itertools
import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from simdist.script.rank import client, earlystore, stack

TCP_TIMEOUT = timedelta(seconds=300)  # TCPStore's default timeout (torch 2.13's signature)
_KEPT: list[SimStore] = []  # every SimStore made (`default_store`)
_CLIENTS = itertools.count(1)  # each SimStore's number (`keystore.client_of`; 0: a call that names none)


def _bytes(value: Any) -> bytes:
    """A value as torch's bindings take it: str (UTF-8) or bytes."""
    return value.encode() if isinstance(value, str) else bytes(value)


def _text(value: Any) -> str:
    return _bytes(value).decode("latin-1")


def _raised(reply: dict[str, Any]) -> dict[str, Any]:
    """The coordinator's reply, or the error it names raised as torch's class of it."""
    if reply.get("raise"):
        kind, message = reply["raise"]
        raise getattr(dist, kind, RuntimeError)(message)
    return reply


class SimStore(dist.Store):
    """The default store of a simulated rank (under torch's `PrefixStore("default_pg", ...)`,
    as torchrun's agent store is)."""

    _space = "agent"  # which store a call before init reaches (`rank.earlystore`; `routed`)

    def __init__(self, timeout: timedelta, counted: bool = True) -> None:
        super().__init__()
        self.set_timeout(timeout)
        # each client is a connection of its own: the server may close one and not the rank's
        # others (`keystore.client_of`)
        self._client = next(_CLIENTS)
        # made with a world size (torchrun's env:// client is): TCPStore counts its workers in a
        # key of its own (`keystore.KVState.internal`) as the client is made, or, made before
        # init, with its first call
        self._counted = counted
        self._count_in()

    def _count_in(self) -> None:
        c = client.CLIENT
        if self._counted and c is None:  # made before init: it counts in as it is made, as TCPStore's client does
            _raised(earlystore.request({"t": "kv", "op": "join", "space": self._space}))
        elif self._counted:
            c.send({"t": "kv", "op": "set", "post": True, "keys": [], "vals": [], "init": True})
        self._counted = False

    def _call(self, op: str, keys: list[str], vals: list[Any] | tuple = (), limit: timedelta | None = None) -> dict[str, Any]:
        c = client.CLIENT
        header: dict[str, Any] = {"t": "kv", "op": op, "keys": [str(k) for k in keys], "client": self._client,
                                  "vals": [_text(v) for v in vals]}
        if c is None:  # before the process's first init: answered as it comes, its wait on the wall clock
            if limit is not None:
                header.update(to=0.0 if not limit else None, wall=limit.total_seconds(), limit=limit.total_seconds())
            return _raised(earlystore.request({**header, "space": self._space}))
        self._count_in()
        header["cpu"] = time.thread_time()
        if limit is not None:  # a timeout as long as torch's default or longer: no deadline (a hang, `deadlines`)
            header["to"] = limit.total_seconds() if limit < c10d.default_pg_timeout else None
            header["limit"] = limit.total_seconds()  # (for the hang's note: when real torch would end it)
            header["frames"] = stack.caller_stack(2)
        # every call may wait (a wait for its keys, any call for its turn on the simulated clock:
        # `keystore.KeyStoreMixin._kv_ready`): its thread counts as blocked until the reply
        return _raised(c.request(header, blocks=True))

    def set(self, key: str, value: Any) -> None:
        self._call("set", [key], [value])

    def get(self, key: str) -> bytes:
        return self._call("get", [key], limit=self.timeout)["vals"][0].encode("latin-1")

    def add(self, key: str, value: int) -> int:
        return int(self._call("add", [key], [str(int(value))])["v"])

    def check(self, keys: list[str]) -> bool:
        return bool(self._call("check", list(keys))["v"])

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._call("wait", list(keys), limit=self.timeout if timeout is None else timeout)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        return self._call("compare_set", [key], [expected_value, desired_value])["v"].encode("latin-1")

    def append(self, key: str, value: Any) -> None:
        self._call("append", [key], [value])

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return [v.encode("latin-1") for v in self._call("multi_get", list(keys), limit=self.timeout)["vals"]]

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._call("multi_set", list(keys), list(values))

    def clone(self) -> SimStore:
        """A second client of the same store (torch's `shrink_group` clones its group's store):
        TCPStore's clone is a connection of its own with the timeout copied, not shared
        (measured on torch 2.13: a later `set_timeout` of either leaves the other's)."""
        return keep(self._twin())

    def _twin(self) -> SimStore:
        return SimStore(self.timeout, counted=False)

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the trampoline's C++ name
        return bool(self._call("delete", [key])["v"])

    def getNumKeys(self) -> int:  # noqa: N802 - the trampoline's C++ name
        return int(self._call("num_keys", [])["v"])

    def num_keys(self) -> int:
        return self.getNumKeys()

    def delete_key(self, key: str) -> bool:
        return self.deleteKey(key)

    def list_keys(self) -> list[str]:
        return [str(k) for k in self._call("list_keys", [])["v"]]

    def queue_push(self, key: str, value: Any) -> None:
        self._call("queue_push", [key], [value])

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        """A blocking pop waits for the name first (the store's timeout, its words), then pops:
        torch's client does so (a peer's pop in between leaves it "queue is empty")."""
        if block:
            self._call("wait", [key], limit=self.timeout)
        return self._call("queue_pop", [key])["v"].encode("latin-1")

    def queue_len(self, key: str) -> int:
        return int(self._call("queue_len", [key])["v"])


def named_as(cls: type, torchs: type) -> None:
    """Name `cls` as torch names `torchs`: `type(store).__name__`, `__module__`, `__qualname__`
    are what a script prints or compares, and a stand-in shows torch's."""
    cls.__name__, cls.__qualname__, cls.__module__ = torchs.__name__, torchs.__qualname__, torchs.__module__


def post(store: Any, key: str, value: Any) -> None:
    """Set `key` through `store` without waiting for the coordinator or a turn on the clock:
    Gloo's address key when a rank makes a group (`rank.backend`), which only `num_keys` and
    `list_keys` see. A held call there would make a rank whose peer never gets that far wait in
    "store.set" where real Gloo waits in the group's rendezvous."""
    while isinstance(store, SimPrefixStore):
        key, store = f"{store._prefix}/{key}", store.underlying_store
    c = client.CLIENT
    if not isinstance(store, SimStore) or c is None:  # (a store the script gave init: Gloo's set, for real)
        store.set(key, value)
        return
    c.send({"t": "kv", "op": "set", "post": True, "keys": [key], "vals": [_text(value)]})


class SimPrefixStore(dist.Store):
    """torch's `PrefixStore` over a simulated store, in Python: torch's C++ one calls a Python
    store through a trampoline that has no queue or `list_keys` (measured: "queue support is
    not implemented"), where a `PrefixStore` over a TCPStore has them. Keys are torch's
    (`<prefix>/<key>`); `list_keys` gives the keys under the prefix without it, `num_keys` the
    store's count (measured on torch 2.13)."""

    def __init__(self, prefix: str, store: dist.Store) -> None:
        super().__init__()
        self._prefix, self._store = str(prefix), store
        keep(self)

    def _k(self, key: str) -> str:
        return f"{self._prefix}/{key}"

    @property
    def underlying_store(self) -> dist.Store:
        return self._store

    @property
    def timeout(self) -> timedelta:  # type: ignore[override]
        return self._store.timeout

    def set_timeout(self, timeout: timedelta) -> None:
        self._store.set_timeout(timeout)

    def set(self, key: str, value: Any) -> None:
        self._store.set(self._k(key), value)

    def get(self, key: str) -> bytes:
        return self._store.get(self._k(key))

    def add(self, key: str, value: int) -> int:
        return self._store.add(self._k(key), value)

    def check(self, keys: list[str]) -> bool:
        return self._store.check([self._k(k) for k in keys])

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        ks = [self._k(k) for k in keys]
        self._store.wait(ks) if timeout is None else self._store.wait(ks, timeout)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        return self._store.compare_set(self._k(key), expected_value, desired_value)

    def append(self, key: str, value: Any) -> None:
        self._store.append(self._k(key), value)

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._store.multi_get([self._k(k) for k in keys])

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._store.multi_set([self._k(k) for k in keys], values)

    def clone(self) -> SimPrefixStore:
        return SimPrefixStore(self._prefix, self._store.clone())

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the trampoline's C++ name
        return self._store.delete_key(self._k(key))

    def getNumKeys(self) -> int:  # noqa: N802 - the trampoline's C++ name
        return self._store.num_keys()

    def num_keys(self) -> int:
        return self.getNumKeys()

    def delete_key(self, key: str) -> bool:
        return self.deleteKey(key)

    def list_keys(self) -> list[str]:
        head = f"{self._prefix}/"
        return [k[len(head):] for k in self._store.list_keys() if k.startswith(head)]

    def queue_push(self, key: str, value: Any) -> None:
        self._store.queue_push(self._k(key), value)

    def queue_pop(self, key: str, block: bool = True) -> bytes:
        return self._store.queue_pop(self._k(key), block)

    def queue_len(self, key: str) -> int:
        return self._store.queue_len(self._k(key))


named_as(SimPrefixStore, dist.PrefixStore)


class SimTCPStore(SimStore):
    """A client of the shared store showing TCPStore's attributes: a script's own client of the
    agent's store (`rank.ownstore`), the keys as they are (no prefix), and the base of a
    rank's default store (`default_store`), at the address init read, as on torchrun."""

    def __init__(self, host_name: str, port: int, world_size: int | None = None, is_master: bool = False,
                 timeout: timedelta = TCP_TIMEOUT, wait_for_workers: bool = True, multi_tenant: bool = False,
                 master_listen_fd: int | None = None, use_libuv: bool = True) -> None:
        counted = world_size is not None and wait_for_workers and not is_master
        connects = client.CLIENT is None and self._space == "hosted" and not is_master  # (rank 0's server may not be up)
        super().__init__(timeout, counted=counted and not connects)
        self._host, self._port, self._uv = host_name, int(port), bool(use_libuv)
        keep(self)
        if connects:  # made before init, a client of rank 0's own store: it connects once the server is up
            _raised(earlystore.request({"t": "kv", "op": "join", "space": self._space, "count": counted,
                                        "at": [str(host_name), int(port)], "limit": timeout.total_seconds()}))
        if is_master:
            self._serve(int(world_size) if world_size is not None and wait_for_workers else None, timeout)

    def _serve(self, world_size: int | None, timeout: timedelta) -> None:
        """A server: before init, one that is rank 0's own (`space` "hosted": the agent's port
        is no server of a rank's, its bind fails) is up from now on for the clients waiting to
        connect, and, made with a world size (and `wait_for_workers`), counts itself in and returns
        only once `world_size` clients, itself one, have, or raises TCPStore's "Timed out after
        <N> seconds waiting for clients. <k>/<W> clients joined." (`stores.host_timeout`), as
        torch's `waitForWorkers` does; else it counts in as a client would."""
        if client.CLIENT is None and self._space == "hosted":
            _raised(earlystore.request({"t": "kv", "op": "serve", "space": self._space, "n": world_size or 0,
                                        "count": world_size is not None, "at": [self._host, self._port],
                                        "limit": timeout.total_seconds()}))
        elif world_size is not None:
            self._counted = True
            self._count_in()

    def _twin(self) -> SimTCPStore:
        return SimTCPStore(self._host, self._port, None, timeout=self.timeout, use_libuv=self._uv)

    @property
    def host(self) -> str:
        return self._host

    @property
    def port(self) -> int:
        return self._port

    @property
    def libuvBackend(self) -> bool:  # noqa: N802 - torch's name
        return self._uv


named_as(SimTCPStore, dist.TCPStore)


def routed(space: str, host_name: Any, port: Any, *args: Any, **kwargs: Any) -> SimTCPStore:
    """A script's own `TCPStore` the simulator serves (`rank.ownstore`), with the arguments the
    script gave; `space`: the store it reaches before init, "agent" (torchrun's agent store) or
    "hosted" (the store rank 0 serves at the script's port, `ownstore._ahead`)."""
    store = SimTCPStore.__new__(SimTCPStore)
    store._space = space
    store.__init__(host_name, port, *args, **kwargs)  # type: ignore[misc]
    return store


def default_store(timeout: timedelta | None, at: tuple[str, int] | None, world_size: int) -> dist.Store:
    """What a simulated rank's init gets as its store: the shared store under torch's own
    prefix, with init's timeout (torch sets the rendezvous store's so), as under torchrun; its
    base a TCPStore of the address init read (`at`, env:// or tcp://: what torch's rendezvous
    makes, its `host` and `port` what a script that walks `underlying_store` finds).
    Kept alive here: a Python subclass held only by C++ (the `PrefixStore`) loses its Python
    half when its last Python reference goes (its calls then fail with "Tried to call pure
    virtual function"), so each stays for the process's life (one per init)."""
    limit = timeout if timeout is not None else c10d.default_pg_timeout
    store = keep(SimStore(limit)) if at is None else SimTCPStore(at[0], at[1], world_size, timeout=limit)
    return SimPrefixStore("default_pg", store)


def keep(store: Any) -> Any:
    """Keep `store` for the process's life (`default_store` says why)."""
    _KEPT.append(store)
    return store
