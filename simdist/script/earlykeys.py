"""Store calls of a process before its first `init_process_group` (`rank.earlystore`).

Before a process's first init nothing is simulated: its rank is not known yet (an `mp.spawn`
child learns it from its arguments), it runs the script's code for real, and when it entered
init is the model (`simdist.script.rendezvous`). So a call before init is answered in the
order calls come, as the real server does, at a key space the process's later init meets
(`space`): "agent" is torchrun's agent store, which every generation at it shares; "hosted"
is the store rank 0 serves at the script's port (`rank.ownstore._ahead`), the key space of
the generation being formed (`KeyStoreMixin._kv_state` adopts the one made before any such
generation, `pending`). A wait's timeout runs on the wall clock from the call, with
TCPStore's words (`keystore.wait_timeout`); a store made with a world size counts itself in
(TCPStore's count of its workers, the key `num_keys` counts), and rank 0's own server
(`is_master=True` before init, `wait_for_workers`) returns once that many have, or raises
`Timed out after <N> seconds waiting for clients. <k>/<W> clients joined.` at N =
floor(T) + 1 s on the wall clock (`stores.host_timeout`, measured on torch 2.13).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from simdist.script.kvstate import KVCall, KVState
from simdist.script.ranks import RankConn
from simdist.script.stores import CONNECT_FACTOR, connect_timeout, host_timeout, host_wait_s

AGENT, HOSTED = "agent", "hosted"  # the key spaces a call before init reaches


@dataclass
class Serving:
    """Rank 0's own server waiting for its workers (TCPStore's `waitForWorkers`)."""

    conn: RankConn
    req: int
    world_size: int
    limit_s: float
    since: float

    def due(self) -> float:
        return self.since + host_wait_s(self.limit_s)


@dataclass
class Connecting:
    """A client of rank 0's own store made before the server is up: TCPStore's client retries
    its connect until it is, or gives up after about twice its timeout (`stores.CONNECT_FACTOR`)
    with "The client socket has timed out after <T ms>ms while trying to connect to (<host>,
    <port>)." (`stores.connect_timeout`: the address the script named)."""

    conn: RankConn
    req: int
    counted: bool
    at: tuple[str, int]
    limit_s: float
    since: float

    def due(self) -> float:
        return self.since + CONNECT_FACTOR * self.limit_s


class EarlyKeysMixin:
    """The coordinator's side of calls before init (a base of `keystore.KeyStoreMixin`). Needs
    `gens`, `_send`, and keystore's `_kv_state`, `_kv_do`, `_kv_timed_out`."""

    gens: list[Any]
    _send: Any
    _kv_state: Any
    _kv_do: Any
    _kv_timed_out: Any

    def _kv_pending(self, make: bool = True) -> KVState | None:
        """The key space of a store rank 0 serves before any generation meets at it (None: none yet)."""
        if make and "_kv_pending_state" not in self.__dict__:
            self.__dict__["_kv_pending_state"] = KVState()
        return self.__dict__.get("_kv_pending_state")

    def _kv_adopt(self) -> KVState | None:
        """The pending key space, for the hosted generation now made (None: none was made)."""
        return self.__dict__.pop("_kv_pending_state", None)

    def _kv_early_space(self, space: str) -> KVState:
        if space == AGENT:
            return self._kv_state(None)
        forming = next((g for g in self.gens if g.hosted and not g.complete()), None)
        return self._kv_state(forming) if forming is not None else self._kv_pending()

    def _kv_early(self, conn: RankConn, h: dict[str, Any]) -> None:
        """A call before init: answered now, or parked until its keys come or its wall-clock timeout."""
        conn.pid = conn.pid or h.get("pid")
        space = str(h.get("space"))
        st = self._kv_early_space(space)
        op, req = str(h["op"]), int(h["req"])
        at = h.get("at") or ["", 0]
        if op == "join" and space == HOSTED and not self._kv_server_up(st, int(at[1])):  # its connect waits for the server
            st.connecting.append(Connecting(conn, req, bool(h.get("count", True)), (str(at[0]), int(at[1])),
                                            float(h.get("limit") or 0.0), time.time()))
            return
        if op == "serve":
            st.servers.add(int(at[1]))
        if op in ("join", "serve"):  # TCPStore's count of its workers: a client made with a world size, or a server
            self._kv_count_in(st, bool(h.get("count", True)))
            if op == "serve" and int(h.get("n") or 0):
                st.serving.append(Serving(conn, req, int(h["n"]), float(h["limit"]), time.time()))
            else:
                self._send(conn, {"t": "reply", "req": req})
            self._kv_served(st)
            return
        self._kv_do(st, KVCall(conn, h, conn.clock))

    def _kv_server_up(self, st: KVState, port: int) -> bool:
        """Rank 0's own store at `port` is up: its server was made, or rank 0 entered the init that
        hosts it there."""
        return port in st.servers or any(g.hosted and (w := g.entered.get(0)) is not None and w.host is not None
                                         and w.host[1] == port and self._kv_state(g) is st for g in self.gens)

    def _kv_count_in(self, st: KVState, counted: bool) -> None:
        if counted:
            st.workers += 1
            st.internal = True

    def _kv_served(self, st: KVState) -> None:
        """Rank 0's servers whose workers have all counted in return."""
        for s in [s for s in st.serving if st.workers >= s.world_size]:
            st.serving.remove(s)
            self._send(s.conn, {"t": "reply", "req": s.req})

    def _kv_early_expired(self, spaces: list[KVState]) -> None:
        """Waits before init whose timeout ran out on the wall clock raise torch's words."""
        now = time.time()
        for st in spaces:
            for w in [w for w in st.waits if w.wall is not None and now >= w.wall]:
                st.waits.remove(w)
                self._kv_timed_out(w)
            for c in list(st.connecting):
                if (up := self._kv_server_up(st, c.at[1])) or now >= c.due():
                    st.connecting.remove(c)
                    self._kv_count_in(st, c.counted and up)
                    self._send(c.conn, {"t": "reply", "req": c.req, "raise": None if up else connect_timeout(c.limit_s, c.at)})
                    self._kv_served(st)
            for s in [s for s in st.serving if now >= s.due()]:
                st.serving.remove(s)
                self._send(s.conn, {"t": "reply", "req": s.req, "raise": host_timeout(s.limit_s, st.workers, s.world_size)})
