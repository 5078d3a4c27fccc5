"""The simulated `new_group`: a member returns once every member made the group.

Gloo's group constructor connects its members through the c10d store under the group's name
(`connectFullMesh`): each member posts its address and waits for every other member's. So a
member that never calls `new_group` (it exited, waits in another collective, or made its
groups in another order: names are per rank) leaves the others waiting there. On real torch
that wait ends at the group's `timeout=` (torch's default: 30 min) with the store's error,
measured on torch 2.13 (`tests/scripts/new_group_member_skips.py exits 2`, 2 ranks, rank 1
exits): `DistStoreError: wait timeout after 2000ms, keys: <prefix>/<group>//cpu//0/<r>`, r the
missing member's rank in the group, 2 s after the call (`group_timeout`).

Here a waiting member is blocked (`ranks.Block`, labelled `NEW_GROUP_WAIT`), as one in a
collective is: once every live rank is blocked the coordinator's proof of a hang covers it;
then the waits with a group timeout end with the store's error (`_group_expire`, as
`rendezvous._init_expire` ends init's), and the rest are the hang, explained by
`group_notes` (who waits at which line, who never came and why).
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from typing import Any

from simdist.script.ranks import Block, RankConn, exit_words, first_user
from simdist.script.stores import STORE_PREFIX

NEW_GROUP_WAIT = "waiting in new_group"  # how a member that waits there for the others is reported


@dataclass
class Creating:
    """A member waiting in a group's creation: the request to answer, its simulated clock
    then, the group's timeout (None: torch's default), the group's members, torch's name of
    the group (the store key's part) and its call site."""

    conn: RankConn
    req: int
    clock: float
    limit_s: float | None
    ranks: list[int]
    key: str
    frames: list[Any]


def group_timeout(limit_s: float, key: str, missing: int) -> tuple[str, str]:
    """What a member raises when its wait at the store for member `missing`'s address (its
    rank in the group) runs out."""
    return "DistStoreError", (f"wait timeout after {round(limit_s * 1000)}ms, keys: "
                              f"{STORE_PREFIX}/0//{key}//cpu//0/{missing}")


def _at(frames: list[Any]) -> str:
    f = first_user(frames)
    return f" at {str(f[0]).rsplit('/', 1)[-1]}:{f[1]}" if f is not None else ""


class GroupsMixin:
    """The coordinator's side of `new_group`. Needs `_creating` (group name -> rank ->
    `Creating`), `protocol_errors`, `timeouts`, `members()`, `_send`."""

    _creating: dict[str, dict[int, Creating]]
    protocol_errors: list[str]
    timeouts: dict[tuple[str, int | None], float]
    _send: Any

    def _group(self, conn: RankConn, h: dict[str, Any]) -> None:
        if conn.gen is None:
            return
        ranks = sorted(int(r) for r in h["ranks"])
        if h.get("to") is not None:
            self.timeouts[h["g"], conn.rank] = float(h["to"])
        have = conn.gen.engine.add_group(h["g"], ranks)
        if have != ranks:
            self.protocol_errors.append(f"group {h['g']} created with ranks {ranks} and {have}")
        if h.get("req") is None:
            return
        # Names are per rank (a creation count, or a hash of the ranks and how many groups the
        # rank has), so ranks that make groups in different orders wait for good.
        waiting = self._creating.setdefault(h["g"], {})
        frames = list(h.get("frames") or [])
        waiting[conn.rank] = Creating(conn, int(h["req"]), conn.clock, None if h.get("to") is None else float(h["to"]),
                                      ranks, str(h.get("key") or h["g"]), frames)  # type: ignore[index]
        conn.block = Block([], time.time(), frames, NEW_GROUP_WAIT)
        if have != ranks or set(waiting) >= set(ranks):
            start = max(w.conn.clock for w in waiting.values())
            for w in self._creating.pop(h["g"]).values():
                w.conn.block, w.conn.clock = None, max(w.conn.clock, start)
                self._send(w.conn, {"t": "reply", "req": w.req})

    def _group_expire(self) -> bool:
        """Nothing else can progress: the members waiting in a group's creation with a
        timeout end with the store's error (`group_timeout`), at their entry + T. Whether one did."""
        fired = False
        for name, waiting in list(self._creating.items()):
            for r, w in list(waiting.items()):
                if w.limit_s is None or not w.conn.active():
                    continue
                missing = next(i for i, m in enumerate(w.ranks) if m not in waiting)
                del waiting[r]
                w.conn.block, w.conn.clock = None, w.clock + w.limit_s
                self._send(w.conn, {"t": "reply", "req": w.req, "raise": group_timeout(w.limit_s, w.key, missing)})
                fired = True
            if not waiting:
                del self._creating[name]
        return fired

    def group_notes(self) -> list[str]:
        """Why members wait in a group's creation: which members never called it, and where
        they are instead (their process ended, or they wait elsewhere)."""
        notes = []
        for waiting in self._creating.values():
            here = [w for w in waiting.values() if w.conn.active()]
            if not here:
                continue
            first = here[0]
            gen = first.conn.gen
            why = []
            for m in (m for m in first.ranks if m not in waiting):
                c = gen.by_rank.get(m) if gen is not None else None
                if c is None or not c.connected:
                    how = exit_words(c.exit) if c is not None and c.exit else "ended"
                    where = _at([[*c.exit["where"][:3], True]]) if c is not None and c.exit and c.exit.get("where") \
                        else ""
                    why.append(f"rank {m} never called it: its process left ({how}{where})")
                elif c.block is not None and c.block.label == NEW_GROUP_WAIT:  # torch named it apart on that rank
                    why.append(f"rank {m} never called it: it waits in a group's creation under another name (ranks "
                               f"that made their groups in different orders){_at(c.block.frames)}")
                elif c.block is not None:
                    why.append(f"rank {m} never called it: it waits{_at(c.block.frames)}")
                else:
                    why.append(f"rank {m} has not called it")
            ranks = sorted(int(w.conn.rank) for w in here)  # type: ignore[arg-type]
            notes.append(f"new_group: rank(s) {ranks} wait in new_group(ranks={first.ranks}){_at(first.frames)} "
                         f"for every member (Gloo's full-mesh connect at the c10d store): {'; '.join(why)}")
        return notes
