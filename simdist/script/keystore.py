"""The c10d store the simulated ranks share: held here, on the simulated clock.

One key space serves every generation of ranks at torchrun's agent store, one a generation
where rank 0 hosts the store (`KeyStoreMixin._kv_state`).

On real Gloo under torchrun every rank's default store (`c10d._get_default_store()`, a
`PrefixStore` over the agent's TCPStore) reaches one server, so a script (or a library: torch
elastic's `store.barrier`, leader elections by `compare_set`, counters by `add`) exchanges
its own data through it. The simulated ranks' default store (`rank.simstore.SimStore`) sends
each operation here; a `get`, `wait` or `multi_get` whose keys are not all there parks its rank
(a `Block` labelled `waiting in store.get`, ...) until another rank sets them or the store's
timeout ends the wait: a `Deadline` of kind `STORE_KIND`, so it fires in simulated-time
order with Gloo's, init's, new_group's and the store-based barrier's (`deadlines.next_due`).
A wait without a timeout shorter than torch's default is a hang when nothing can set its keys.

The semantics are TCPStore's (torch 2.13's libuv server), measured on one server
(docs/script-backend.md, "The store shared across ranks"):

* a wait that runs out raises `DistStoreError: wait timeout after <T ms>ms, keys: /<k1>, /<k2>`
  (every key waited for, each with TCPStore's "/" prefix, the present ones too), T after the
  call; a timeout of 0 raises at once; `get` and `multi_get` wait as `wait` does;
* `add` parses the value as C's `stoll` does (leading blanks, a sign, digits; the rest
  ignored: "7 " is 7); a value with no number ends the server's connection to that client:
  `DistNetworkError: Failed to recv, got 0 bytes. ...`; that client's next call raises that
  too (its request goes out, the answer is the closed connection's end of file), every later
  one "Broken pipe" (`BROKEN`: the server's reset came back); the rank's other clients (its
  default store, a script's own, `client_of`) go on working;
* `compare_set` on a missing key sets it only when the expected value is empty and returns the
  new value, else returns the expected value; on a present key it returns the new value when
  the current one matched, else the current one;
* `delete_key` says whether the key was there; `check([])` and `wait([])` are true at once;
  `append` to a missing key creates it.

Order on the clocks: a call takes effect at its rank's simulated time t, held until no other
rank at the store can reach it before t (`KeyStoreMixin._kv_ready`), so an `add`,
`check` or `compare_set` reads what the calls before it in simulated time wrote, whatever
order they reach the coordinator in (a peer's store timeout, proven only once nothing else
can come first, comes after calls later than it in wall time). A value written at simulated
time t reaches a reader at t at the
earliest (its clock moves on to t), and a waiter whose deadline comes before t times out
instead (its timeout ran out before the write). `num_keys` counts the keys the script's
generations wrote here (Gloo's addresses too, `rank.backend`) and TCPStore's own count of its
workers; the queues (`queue_push`, `queue_pop`, `queue_len`) are held apart from the keys.
"""

from __future__ import annotations

import re
import time
from typing import Any

from simdist.script.deadlines import Deadline
from simdist.script.earlykeys import EarlyKeysMixin
from simdist.script.kvstate import Entry, KVCall, KVState, KVWait
from simdist.script.ranks import Block, RankConn, waiting_in
from simdist.script.stores import SERVER_GONE

STORE_KIND = "store"  # its kind of `Deadline`
HELD_KIND = "store call"  # a store call held until it comes first in simulated time (`KeyStoreMixin._kv_ready`)
WAITS = ("get", "wait", "multi_get")  # the operations that wait for their keys
BROKEN = ("DistNetworkError", "Broken pipe")  # every call of a client whose connection the server closed
QUEUE_EMPTY = ("QueueEmptyError", "queue is empty")  # a `queue_pop` that finds nothing (after its wait, if it blocks)
_STOLL = re.compile(rb"[ \t\n\v\f\r]*([+-]?[0-9]+)")
_INT64 = 2**63


def wait_timeout(limit_s: float, keys: list[str]) -> tuple[str, str]:
    """What a store wait for `keys` (as the store holds them) raises when its timeout runs out."""
    return "DistStoreError", f"wait timeout after {round(limit_s * 1000)}ms, keys: " + ", ".join(f"/{k}" for k in keys)


def stoll(value: bytes) -> int | None:
    """The number C's `stoll` reads from `value` (TCPStore's `add`), or None where it throws."""
    m = _STOLL.match(value)
    n = int(m.group(1)) if m else None
    return n if n is not None and -_INT64 <= n < _INT64 else None


def _reaches(conn: RankConn) -> bool:
    """Whether a rank's process may still act before a store call: it is there. One that destroyed
    its default group may call the store: the `PrefixStore` it kept is a client of the agent's
    server still on real torch (`c10d._get_default_store()` no longer is); one that said it
    exits calls nothing, but its end, at its clock, may still end its peers' waits (Gloo's
    peer loss), and they may call the store then."""
    return conn.connected


def client_of(conn: RankConn, h: dict[str, Any]) -> tuple[int, int]:
    """Which connection a call came on: its process's (pid) and its client's (`rank.simstore`: each
    client of a rank, the default store and a script's own, is a connection of its own, so a
    server that closes one leaves the rank's others working; measured on torch 2.13)."""
    return int(conn.pid or 0), int(h.get("client") or 0)


class KeyStoreMixin(EarlyKeysMixin):
    """The coordinator's side of the shared store. Needs `gens`, `measure_compute` and `_send`."""

    gens: list[Any]
    measure_compute: bool
    _send: Any

    def _kv_state(self, gen: Any) -> KVState:
        """The key space `gen`'s ranks meet at: under torchrun the agent's one store, whose keys
        every generation shares (destroy and init again reads the first's: measured, `rank.genkeys`);
        where rank 0's init hosts a store (`Generation.hosted`: env:// or tcp:// without the
        agent, a second `mp.spawn`) a new one each init, the generation's own."""
        states: dict[tuple[int, ...], KVState] = self.__dict__.setdefault("_kv_states", {})
        key = (gen.index,) if gen is not None and gen.hosted else ()  # (None: the agent's, before any init)
        if key not in states:  # a hosted one meets the keys written before its generation was made (`earlykeys`)
            states[key] = (self._kv_adopt() if key else None) or KVState()
        return states[key]

    def _kv_spaces(self) -> list[KVState]:
        """Every key space, once (generations may share one; one made before init, `earlykeys`)."""
        states = [*map(self._kv_state, self.gens), *self.__dict__.get("_kv_states", {}).values(), self._kv_pending(False)]
        return list({id(st): st for st in states if st is not None}.values())

    def _kv(self, conn: RankConn, h: dict[str, Any]) -> None:
        """One store operation of `conn`'s (`rank.simstore`): answered at its caller's simulated
        time, once no peer can still act at the store before it (`_kv_ready`), else held till then."""
        if h.get("early"):  # a call before the process's first init (`earlykeys`)
            return self._kv_early(conn, h)
        conn.advance(h, self.measure_compute)
        if h.get("post"):  # Gloo's key for a group the rank made (`rank.backend`): no reply, no turn
            if conn.gen is not None:
                st = self._kv_state(conn.gen)
                if h.get("init"):  # a client made with a world size counted itself in
                    st.internal, st.workers = True, st.workers + 1
                    self._kv_served(st)
                st.keys.update((str(k), Entry(str(v).encode("latin-1"), conn.clock)) for k, v in zip(h["keys"], h["vals"], strict=True))
                self._kv_wake(st)
            return
        if conn.gen is None:
            self._send(conn, {"t": "reply", "req": int(h["req"]), "raise": BROKEN})
            return
        st = self._kv_state(conn.gen)
        call = KVCall(conn, h, conn.clock)
        if self._kv_ready(call):
            self._kv_do(st, call)
        else:
            call.held = True
            st.held.append(call)
            conn.wait_in_request(Block([], time.time(), list(h.get("frames") or []), waiting_in(f"store.{h['op']}")))
        self._kv_release()

    def _kv_ready(self, call: KVCall) -> bool:
        """Whether no other rank at the store (every generation's that shares it) can still reach it before `call`'s time:
        each is there already on its clock, or blocked with nothing due before it that frees it
        (a timeout, a held store call of its own). What reaches the coordinator first need not
        come first: a peer's store wait that times out earlier is known only once nothing else
        can happen before it (`deadlines.next_due`), and a rank's measured compute is no wall time."""
        t, st = call.clock, self._kv_state(call.conn.gen)
        others = [c for g in self.gens if self._kv_state(g) is st for c in g.by_rank.values()
                  if c is not call.conn and _reaches(c) and c.clock < t]
        if not others:
            return True
        if not all(c.blocked() for c in others):
            return False
        ids = {id(c) for c in others}
        return not any((d.at, d.rank) < (t, int(call.conn.rank)) for d in self._deadlines()  # type: ignore[attr-defined,arg-type]
                       if id(d.conn) in ids)

    def _kv_release(self) -> None:
        """Do the held store calls that nothing can precede any more, earliest first; end the
        waits before init whose timeout ran out on the wall clock (`earlykeys`)."""
        self._kv_early_expired(self._kv_spaces())
        for st in self._kv_spaces():
            st.held = [c for c in st.held if c.conn.connected]
            while ready := [c for c in sorted(st.held, key=KVCall.order) if self._kv_ready(c)][:1]:
                st.held.remove(ready[0])
                self._kv_do(st, ready[0])

    def _kv_do(self, st: KVState, call: KVCall) -> None:
        """Answer `call` now, at its clock: a write wakes the waits it completes; a wait whose keys
        are not all there parks its rank until they are or its timeout."""
        conn, h = call.conn, call.h
        req, op = int(h["req"]), str(h["op"])
        keys, vals = [str(k) for k in h.get("keys") or []], [str(v).encode("latin-1") for v in h.get("vals") or []]
        if (who := client_of(conn, h)) in st.broken:
            st.broken[who] += 1
            if call.held:
                conn.answered()
            self._send(conn, {"t": "reply", "req": req, "raise": SERVER_GONE if st.broken[who] == 1 else BROKEN})
            return
        if op in WAITS:
            w = KVWait(conn, req, op, keys, call.clock, None if h.get("to") is None else float(h["to"]),
                       list(h.get("frames") or []), float(h.get("limit") or 0.0))
            w.wall = None if h.get("wall") is None else w.since + float(h["wall"])
            if not self._kv_answer(st, w, call.clock):
                st.waits.append(w)
                if w.wall is None:  # (one before init is no rank's: nothing is simulated yet)
                    conn.wait_in_request(Block([], time.time(), w.frames, waiting_in(f"store.{op}")))
            return
        reply = self._kv_apply(st, conn, op, keys, vals)
        if reply.get("raise") == SERVER_GONE:  # the server closed this client's connection, not the rank's others
            st.broken[who] = 0
        if call.held:
            conn.answered()
        self._send(conn, {"t": "reply", "req": req, **reply})
        self._kv_wake(st)

    def _kv_apply(self, st: KVState, conn: RankConn, op: str, keys: list[str], vals: list[bytes]) -> dict[str, Any]:
        """A store operation that does not wait, at `conn`'s clock: its reply's fields."""
        kv, now = st.keys, conn.clock

        def text(b: bytes) -> str:
            return b.decode("latin-1")

        if op in ("set", "multi_set"):
            for k, v in zip(keys, vals, strict=True):
                kv[k] = Entry(v, now)
            return {}
        if op == "append":
            old = kv.get(keys[0])
            kv[keys[0]] = Entry((old.value if old else b"") + vals[0], now)
            return {}
        if op == "add":
            old = kv.get(keys[0])
            n = stoll(old.value) if old is not None else 0
            if n is None:  # the server's stoll threw: it closes this client's connection (`_kv_do`)
                return {"raise": SERVER_GONE}
            n += int(vals[0])  # (its amount, sent as decimal digits)
            kv[keys[0]] = Entry(str(n).encode(), now)
            return {"v": n}
        if op == "compare_set":
            k, expected, desired = keys[0], vals[0], vals[1]
            cur = kv.get(k)
            if (cur is None and expected == b"") or (cur is not None and cur.value == expected):
                kv[k] = Entry(desired, now)
                return {"v": text(desired)}
            return {"v": text(expected if cur is None else cur.value)}
        if op == "delete":
            return {"v": kv.pop(keys[0], None) is not None}
        if op == "check":
            return {"v": all(st.present(k) is not None for k in keys)}
        if op == "num_keys":
            return {"v": len(kv) + st.internal}
        if op == "list_keys":
            return {"v": list(kv)}
        return self._kv_queue(st, op, keys, vals, now)

    def _kv_queue(self, st: KVState, op: str, keys: list[str], vals: list[bytes], now: float) -> dict[str, Any]:
        """TCPStore's queues: apart from the keys (`num_keys` and `list_keys` skip them, `delete_key`
        leaves them), a `get`, `wait` or `check` of the name sees a non-empty one; a blocking pop
        is a `wait` for the name, then this pop (`rank.simstore`), as torch's client does."""
        if op == "queue_push":
            st.queues.setdefault(keys[0], []).append(Entry(vals[0], now))
            return {}
        if op == "queue_pop":
            q = st.queues.get(keys[0])
            if not q:
                return {"raise": QUEUE_EMPTY}
            value = q.pop(0).value
            if not q:
                del st.queues[keys[0]]
            return {"v": value.decode("latin-1")}
        if op == "queue_len":
            return {"v": len(st.queues.get(keys[0], []))}
        return {"raise": ("RuntimeError", f"simdist: the store has no operation {op!r}")}

    def _kv_answer(self, st: KVState, w: KVWait, now: float) -> bool:
        """Answer `w` if its keys are all there: with their values, its clock at the latest
        write among them; or with its timeout's error when that came first. Whether it ended."""
        found = [st.present(k) for k in w.keys]
        if any(e is None for e in found):
            if w.limit_s == 0:  # a timeout of 0 looks once
                self._kv_timed_out(w)
                return True
            return False
        written = max((e.at for e in found if e is not None), default=now)
        due = w.due()
        if due is not None and written > due:  # its timeout ran out before the last write
            self._kv_timed_out(w)
            return True
        w.conn.clock = max(w.conn.clock, written)
        w.conn.answered()
        vals = [] if w.op == "wait" else [e.value.decode("latin-1") for e in found if e is not None]
        self._send(w.conn, {"t": "reply", "req": w.req, "vals": vals})
        return True

    def _kv_timed_out(self, w: KVWait) -> None:
        w.conn.clock = max(w.conn.clock, w.due() or w.clock)
        w.conn.answered()
        self._send(w.conn, {"t": "reply", "req": w.req, "raise": wait_timeout(w.full_s, w.keys)})

    def _kv_wake(self, st: KVState) -> None:
        """A write may end parked waits: each whose keys are all there now."""
        st.waits = [w for w in st.waits if w.conn.connected and not self._kv_answer(st, w, w.clock)]

    def _store_deadlines(self) -> list[Deadline]:
        """The parked store waits with a timeout: each raises at its call + its timeout."""
        return [Deadline(due, int(w.conn.rank), STORE_KIND, w.conn, (st, w), self._fire_store_waits)  # type: ignore[arg-type]
                for st in self._kv_spaces() for w in st.waits
                if (due := w.due()) is not None and w.conn.connected and w.wall is None] + self._held_deadlines()

    def _held_deadlines(self) -> list[Deadline]:
        """The held store calls: each is due at its own time (nothing then can come before it)."""
        return [Deadline(c.clock, int(c.conn.rank), HELD_KIND, c.conn, (st, c), self._fire_held)  # type: ignore[arg-type]
                for st in self._kv_spaces() for c in st.held if c.conn.connected]

    def _fire_held(self, due: list[tuple[KVState, KVCall]]) -> None:
        """Every rank is blocked and these held calls come first in simulated time: done, in order."""
        for st, call in due:
            if call in st.held:
                st.held.remove(call)
                self._kv_do(st, call)

    def _fire_store_waits(self, due: list[tuple[KVState, KVWait]]) -> None:
        """Their timeout came first (`deadlines.next_due`): these waits raise torch's error."""
        for st, w in due:
            if w in st.waits:
                st.waits.remove(w)
                self._kv_timed_out(w)


    def store_default_timeouts(self) -> list[str]:
        """What the store waits left without a deadline (a hang here) raise on real torch: after
        the store's own timeout (init's, torch's default 30 min where the script gives none)."""
        return [f"store.{w.op}: on real torch rank {w.conn.rank}'s wait ends after its store's timeout "
                f"({w.full_s:g} s): {': '.join(wait_timeout(w.full_s, w.keys))}"
                for st in self._kv_spaces() for w in sorted((w for w in st.waits if w.wall is None), key=lambda w: int(w.conn.rank))  # type: ignore[arg-type]
                if w.limit_s is None and w.conn.active()]
