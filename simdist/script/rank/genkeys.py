"""Real Gloo's side: one key space across generations of ranks, as torchrun's one store has,
with each generation's Gloo rendezvous reading its own generation's addresses.

Under torchrun every init of a process, the first and one after `destroy_process_group`, is
a client of the agent's one TCPStore, and torch names its keys alike each time (destroy
resets the group count: WORLD is "0" again). Measured under `torchrun --standalone` (torch
2.13, 2 ranks: `tests/scripts/store_generations.py reinit`): the keys of generation 1 (Gloo's
address of each rank of each group, a script's own) stay after destroy, a second init
rewrites Gloo's under the same names, `num_keys` stays 8, and a key generation 1 set is read
in generation 2. So the real side's default store is the launcher's in every generation with
torchrun's names (`rank.patches._launcher_store`; it was `simdist/gen<k>/...` for k > 1).

But torchrun's Gloo rendezvous of generation 2 may read a peer's address of generation 1,
left under the same name, before the peer rewrote it: it connects to a listener that is gone
or still generation 1's (measured: that script's `reinit` completed 0 of 6 runs, failing "Connection refused" or
"Connection reset by peer" in its second init or `new_group`, or hanging;
a rank initialising again while its peer still lived in generation 1 failed with "Connection
reset by peer"). That race is torchrun's store, not the program; a compare would flake on it.
So from generation 2 on, the Gloo backend a group creates gets `Fresh`: it writes each key
where the script sees it (the launcher's store: `num_keys`, `list_keys` and `get` as on
torchrun) and, apart, in a store of the generation's own (`env.GEN_STORE`, a second server the
launcher hosts, which no script reaches), and reads there only, so it meets its peers'
addresses of this generation. What a wait there raises names the keys as torchrun does.
"""

from __future__ import annotations

import contextlib
import os
import threading
from collections.abc import Iterator
from datetime import timedelta
from typing import Any

import torch.distributed as dist
import torch.distributed.distributed_c10d as c10d

from simdist.script import env
from simdist.script.rank import simstore

_TORCH_GLOO = c10d.ProcessGroupGloo
_LOCAL = threading.local()  # the group being created (`creating`), per thread
_SHARED: dict[str, int] = {}  # "generation": this process's generation, where its keys are the launcher's store's
_ROOT: list[dist.Store] = []  # this process's client of `env.GEN_STORE`, made at first use


def shared(generation: int | None) -> None:
    """Note this process's default group: `generation` meets at the launcher's store (torchrun's
    agent's stand-in, shared by every generation), or None (a store of its own: rank 0 hosts
    one each init, or a store the script gave)."""
    _SHARED.pop("generation", None)
    if generation is not None:
        _SHARED["generation"] = generation


def _root() -> dist.Store:
    if not _ROOT:
        host, port = os.environ[env.GEN_STORE].rsplit(":", 1)
        _ROOT.append(dist.TCPStore(host, int(port), is_master=False, timeout=c10d.default_pg_timeout))
    return _ROOT[0]


class Fresh(dist.Store):
    """A group's Gloo rendezvous store of generation k > 1: writes go to `shown` (the key the
    script sees, torchrun's) and to `own` (the generation's); reads come from `own` only."""

    def __init__(self, shown: dist.Store, own: dist.Store, tag: str) -> None:
        super().__init__()
        self._shown, self._own, self._tag = shown, own, tag
        self.set_timeout(shown.timeout)

    def _words(self, e: Exception) -> Exception:
        """`e` as torch words it for the key the script sees (without the generation's tag)."""
        return type(e)(str(e).replace(f"/{self._tag}/", "/"))

    def _read(self, call: Any) -> Any:
        try:
            return call()
        except dist.DistError as e:
            raise self._words(e) from None

    def set(self, key: str, value: Any) -> None:
        self._shown.set(key, value)
        self._own.set(key, value)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._shown.multi_set(keys, values)
        self._own.multi_set(keys, values)

    def append(self, key: str, value: Any) -> None:
        self._shown.append(key, value)
        self._own.append(key, value)

    def add(self, key: str, value: int) -> int:
        self._shown.add(key, value)
        return self._own.add(key, value)

    def compare_set(self, key: str, expected_value: Any, desired_value: Any) -> bytes:
        self._shown.compare_set(key, expected_value, desired_value)
        return self._own.compare_set(key, expected_value, desired_value)

    def get(self, key: str) -> bytes:
        return self._read(lambda: self._own.get(key))

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._read(lambda: self._own.multi_get(keys))

    def check(self, keys: list[str]) -> bool:
        return self._own.check(keys)

    def wait(self, keys: list[str], timeout: timedelta | None = None) -> None:
        self._read(lambda: self._own.wait(keys, self.timeout if timeout is None else timeout))

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - the trampoline's C++ name
        self._shown.delete_key(key)
        return self._own.delete_key(key)

    def getNumKeys(self) -> int:  # noqa: N802 - the trampoline's C++ name
        return self._shown.num_keys()


class _AnyGloo(type(_TORCH_GLOO)):  # type: ignore[misc]
    """`isinstance(backend, ProcessGroupGloo)` (torch's own checks) stays true for torch's."""

    def __instancecheck__(cls, obj: Any) -> bool:
        return isinstance(obj, _TORCH_GLOO)

    def __subclasscheck__(cls, sub: Any) -> bool:
        return issubclass(sub, _TORCH_GLOO)


class _FreshGloo(_TORCH_GLOO, metaclass=_AnyGloo):  # type: ignore[misc,valid-type]
    """torch's ProcessGroupGloo while a group of generation k > 1 is created (`creating`):
    over `Fresh`. Its `__new__` returns torch's own backend, so no `__init__` follows."""

    def __new__(cls, store: Any, *args: Any, **kwargs: Any) -> Any:
        made = getattr(_LOCAL, "made", None)
        if made is None:
            return _TORCH_GLOO(store, *args, **kwargs)
        generation, prefix, devices = made
        n = len(_LOCAL.done)  # (a backend beyond the devices': TORCH_DISTRIBUTED_DEBUG=DETAIL's helper, keys apart)
        device = devices[n] if n < len(devices) else f"{devices[-1]}+{n}"
        _LOCAL.done.append(device)
        tag = f"gen{generation}"
        own = dist.PrefixStore(f"{tag}/{prefix}{device}/", _root())
        return _TORCH_GLOO(simstore.keep(Fresh(store, own, tag)), *args, **kwargs)


def _prefix(group_name: str) -> str:
    """The keys of `group_name`'s store as torch names them, before its device's: init's group
    over `PrefixStore("default_pg", ...)`, a later group's over the default group's store."""
    world = c10d.GroupMember.WORLD
    base = "default_pg/" if world is None else f"default_pg/{c10d._world.pg_names[world]}//"  # noqa: SLF001
    return f"{base}{group_name}//"


@contextlib.contextmanager
def creating(group_name: str, backend: Any) -> Iterator[None]:
    """While torch creates group `group_name` (`c10d._new_process_group_helper`): from this
    process's generation 2 on, at the launcher's store, its Gloo backend is over `Fresh`."""
    generation = _SHARED.get("generation")
    if generation is None or generation < 2:
        yield
        return
    config = c10d.BackendConfig(dist.Backend(str(backend)))
    devices = [d for d, b in config.get_device_backend_map().items() if b == dist.Backend.GLOO] or ["cpu"]
    _LOCAL.made, _LOCAL.done = (generation, _prefix(str(group_name)), devices), []
    c10d.ProcessGroupGloo = _FreshGloo  # type: ignore[misc]
    try:
        yield
    finally:
        c10d.ProcessGroupGloo = _TORCH_GLOO  # type: ignore[misc]
        _LOCAL.made = None
