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

import time
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from simdist.script.rank import client, stack

_KEPT: list[SimStore] = []  # every SimStore made (`default_store`)


def _bytes(value: Any) -> bytes:
    """A value as torch's bindings take it: str (UTF-8) or bytes."""
    return value.encode() if isinstance(value, str) else bytes(value)


def _text(value: Any) -> str:
    return _bytes(value).decode("latin-1")


class SimStore(dist.Store):
    """The default store of a simulated rank (under torch's `PrefixStore("default_pg", ...)`,
    as torchrun's agent store is)."""

    def __init__(self, timeout: timedelta) -> None:
        super().__init__()
        self.set_timeout(timeout)

    def _call(self, op: str, keys: list[str], vals: list[Any] | tuple = (), limit: timedelta | None = None) -> dict[str, Any]:
        c = client.CLIENT
        header: dict[str, Any] = {"t": "kv", "op": op, "keys": [str(k) for k in keys],
                                  "vals": [_text(v) for v in vals], "cpu": time.thread_time()}
        if limit is not None:  # a timeout as long as torch's default or longer: no deadline (a hang, `deadlines`)
            header["to"] = limit.total_seconds() if limit < c10d.default_pg_timeout else None
            header["limit"] = limit.total_seconds()  # (for the hang's note: when real torch would end it)
            header["frames"] = stack.caller_stack(2)
        # every call may wait (a wait for its keys, any call for its turn on the simulated clock:
        # `keystore.KeyStoreMixin._kv_ready`): its thread counts as blocked until the reply
        reply = c.request(header, blocks=True)  # type: ignore[union-attr]
        if reply.get("raise"):
            kind, message = reply["raise"]
            raise getattr(dist, kind, RuntimeError)(message)
        return reply

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
        """A second client of the same store (torch's `shrink_group` clones its group's store;
        TCPStore's clone connects to the same server). The timeout is shared, not copied."""
        return self

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the trampoline's C++ name
        return bool(self._call("delete", [key])["v"])

    def getNumKeys(self) -> int:  # noqa: N802 - the trampoline's C++ name
        return int(self._call("num_keys", [])["v"])


def default_store(timeout: timedelta | None) -> dist.Store:
    """What a simulated rank's init gets as its store: the shared store under torch's own
    prefix, with init's timeout (torch sets the rendezvous store's so), as under torchrun.
    Kept alive here: a Python subclass held only by C++ (the `PrefixStore`) loses its Python
    half when its last Python reference goes (its calls then fail with "Tried to call pure
    virtual function"), so each stays for the process's life (one per init)."""
    store = keep(SimStore(timeout if timeout is not None else c10d.default_pg_timeout))
    return dist.PrefixStore("default_pg", store)


def keep(store: SimStore) -> SimStore:
    """Keep `store` for the process's life (`default_store` says why)."""
    _KEPT.append(store)
    return store
