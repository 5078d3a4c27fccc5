"""The shared store's state as the coordinator holds it (`keystore`): one key space, its
parked waits, its held calls, its entries with the simulated time each was written at."""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from typing import Any

from simdist.script.ranks import RankConn


@dataclass
class Entry:
    value: bytes
    at: float  # simulated time at which it was written


@dataclass
class KVWait:
    """A rank parked in a store wait: its request, the keys, its clock at the call, its
    timeout (None: torch's default or longer, a hang when nothing sets the keys)."""

    conn: RankConn
    req: int
    op: str
    keys: list[str]
    clock: float
    limit_s: float | None
    frames: list[Any] = field(default_factory=list)
    full_s: float = 0.0  # its store's timeout, however long (real torch ends the wait then)
    since: float = field(default_factory=time.time)
    wall: float | None = None  # a wait before init (`earlykeys`): when its timeout runs out, on the wall clock

    def due(self) -> float | None:
        return None if self.limit_s is None else self.clock + self.limit_s


@dataclass
class KVCall:
    """A store call as it came (`rank.simstore`), at its rank's clock then."""

    conn: RankConn
    h: dict[str, Any]
    clock: float
    held: bool = False  # its rank waits in it (`RankConn.wait_in_request`) until it is done

    def order(self) -> tuple[float, int]:
        return self.clock, int(self.conn.rank)  # type: ignore[arg-type]


@dataclass
class KVState:
    """One key space (`KeyStoreMixin._kv_state`): its keys, its parked waits, the clients whose connection it closed."""

    keys: dict[str, Entry] = field(default_factory=dict)
    waits: list[KVWait] = field(default_factory=list)
    held: list[KVCall] = field(default_factory=list)  # calls a peer may still precede (`_kv_ready`)
    broken: dict[tuple[int, int], int] = field(default_factory=dict)  # `client_of` -> its calls since the server closed it
    queues: dict[str, list[Entry]] = field(default_factory=dict)  # `queue_push`ed values, apart from the keys
    internal: bool = False  # TCPStore's own key (its workers' count: `num_keys` counts it, `list_keys` hides it)
    workers: int = 0  # the stores made with a world size that counted themselves in there (`earlykeys`)
    serving: list[Any] = field(default_factory=list)  # rank 0's own servers waiting for them (`earlykeys.Serving`)
    servers: set[int] = field(default_factory=set)  # the ports rank 0's own servers are up at (before init: `earlykeys`)
    connecting: list[Any] = field(default_factory=list)  # clients made before it is (`earlykeys.Connecting`)

    def present(self, key: str) -> Entry | None:
        """What a get, wait or check of `key` finds: its value, or, where only a queue of that
        name holds values, an empty one (measured: `get` of such a name returns b"")."""
        if key in self.keys:
            return self.keys[key]
        q = self.queues.get(key)
        return Entry(b"", q[0].at) if q else None
