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
collective is (its request carries the rank's claim, `rank.client.Client.request`: a stale one
kept a rank that ran a collective before new_group from counting as blocked): once every
live rank is blocked the coordinator's proof of a hang covers it;
then the waits with a group timeout end with the store's error in their turn among every
kind of deadline (`_group_deadlines`, `deadlines.next_due`), and the rest are the hang, explained by
`group_notes` (who waits at which line, who never came and why). A member that comes after
a peer's timeout ran out (on the simulated clocks: its sleeps and compute) makes that peer
raise first, then is refused by the address the peer left in the store, as on real Gloo
(`sleeps2 0.5`: rank 0's DistStoreError at 0.5 s, rank 1's "Gloo connectFullMesh failed
with ... Connection refused").
"""

from __future__ import annotations

import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from simdist.script.deadlines import Deadline
from simdist.script.gathering import Gathering, group_words, raises_words, timeouts_words
from simdist.script.ranks import Block, RankConn, exit_words, file_line, user_line, waiting_in
from simdist.script.rendezvous import REFUSED
from simdist.script.scriptclocks import waited_to
from simdist.script.stores import STORE_PREFIX

NEW_GROUP_WAIT = waiting_in("new_group")  # how a member that waits there for the others is reported
NEW_GROUP = "new_group"  # its kind of `Deadline`


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
    failed: bool = False  # its timeout ran out: it raised, its address stays in the store
    since: float = field(default_factory=time.time)  # when it came (wall time: the status lines')
    proc: float | None = None  # the script's clock when it came (`scriptclocks.waited_to`)

    def index(self) -> int:
        """The group rank it registers its address under: its place in its own `ranks`."""
        return self.ranks.index(int(self.conn.rank))  # type: ignore[arg-type]


def unregistered(waiting: dict[int, Creating], size: int) -> list[int]:
    """The group ranks whose address no rank has put in the store yet. Each rank registers
    under its own place in the ranks it passed, so ranks that passed the same members in
    different orders (`new_group(ranks, sort_ranks=False)`) can leave a group rank unwritten:
    all of them wait for it (torch 2.13: rank r passing [r, 1 - r] at 2 ranks, both raise
    the store's wait timeout for group rank 1)."""
    written = {w.index() for w in waiting.values()}
    return [i for i in range(size) if i not in written]


def group_timeout(limit_s: float, key: str, missing: int) -> tuple[str, str]:
    """What a member raises when its wait at the store for member `missing`'s address (its
    rank in the group) runs out."""
    return "DistStoreError", (f"wait timeout after {round(limit_s * 1000)}ms, keys: "
                              f"{STORE_PREFIX}/0//{key}//cpu//0/{missing}")


def _at(frames: list[Any]) -> str:
    line = user_line(frames)
    return f" at {line}" if line is not None else ""


class GroupsMixin:
    """The coordinator's side of `new_group`. Needs `_creating` (group name -> rank ->
    `Creating`), `protocol_errors`, `timeouts`, `measure_compute`, `rendezvous`, `_send`,
    `_live()`, `_default_timeout_s()`."""

    _creating: dict[str, dict[int, Creating]]
    measure_compute: bool
    rendezvous: bool
    _live: Any
    _default_timeout_s: Any
    protocol_errors: list[str]
    timeouts: dict[tuple[str, int | None], float]
    long_limits: set[tuple[str, int | None]]
    unnamed: set[str]
    _send: Any
    _skip: Any

    def _group(self, conn: RankConn, h: dict[str, Any]) -> None:
        if conn.gen is None:
            return
        conn.advance(h, self.measure_compute)  # it enters at its clock now: past its waits and compute
        # group-rank order, as torch made it (sorted unless new_group's sort_ranks=False):
        # results, the status lines and the store key's member index follow it
        ranks = [int(r) for r in h["ranks"]]
        if h.get("to") is not None:
            self.timeouts[h["g"], conn.rank] = float(h["to"])
        elif h.get("lto") is not None:  # torch's default or longer: for its ops alone (`OpRecord.long`)
            self.timeouts[h["g"], conn.rank] = float(h["lto"])
            self.long_limits.add((h["g"], conn.rank))
        have = conn.gen.engine.add_group(h["g"], ranks)
        if h.get("unnamed"):
            self.unnamed.add(h["g"])
        if sorted(have) != sorted(ranks):
            self.protocol_errors.append(f"group {h['g']} created with ranks {ranks} and {have}")
        if h.get("req") is None:
            return
        # Names are per rank (a creation count, or a hash of the ranks and how many groups the
        # rank has), so ranks that make groups in different orders wait for good.
        waiting = self._creating.setdefault(h["g"], {})
        for w in list(waiting.values()):  # those whose timeout ran out before this arrival (the simulated clocks)
            if not w.failed and w.limit_s is not None and w.clock + w.limit_s < conn.clock:
                self._group_failed(w, waiting)
        frames = list(h.get("frames") or [])
        waiting[conn.rank] = Creating(conn, int(h["req"]), conn.clock, None if h.get("to") is None else float(h["to"]),
                                      ranks, str(h.get("key") or h["g"]), frames, proc=h.get("p"))  # type: ignore[index]
        conn.wait_in_request(Block([], time.time(), frames, NEW_GROUP_WAIT))
        if sorted(have) != sorted(ranks) or not unregistered(waiting, len(ranks)):
            # every address is in the store; one of a member that timed out and left refuses the connect
            gone = [r for r, w in waiting.items() if w.failed]
            refused = {"raise": ("RuntimeError", f"{REFUSED} (rank {gone[0]} timed out in new_group)")} if gone else {}
            start = max(w.conn.clock for w in waiting.values() if not w.failed)
            for w in self._creating.pop(h["g"]).values():
                if not w.failed:
                    w.conn.clock = max(w.conn.clock, start)
                    w.conn.answered()
                    self._send(w.conn, {"t": "reply", "req": w.req, **refused})

    def _group_failed(self, w: Creating, waiting: dict[int, Creating]) -> None:
        """`w`'s wait ran out: it raises the store's error (`group_timeout`), its clock at its entry + T."""
        missing = unregistered(waiting, len(w.ranks))[0]
        w.failed, w.conn.clock = True, w.clock + (w.limit_s or 0.0)
        w.conn.answered()
        self._skip(w.conn, waited_to(w.proc, w.clock, w.conn.clock), at=w.conn.clock)  # (its clocks read the wait, as on Gloo; before the reply)
        self._send(w.conn, {"t": "reply", "req": w.req, "raise": group_timeout(w.limit_s or 0.0, w.key, missing)})

    def _group_deadlines(self) -> list[Deadline]:
        """The members waiting in a group's creation with a timeout: each ends with the store's
        error (`group_timeout`) at its entry + T, in its turn (`expiry.GlooTimeoutsMixin._expire_next`)."""
        return [Deadline(w.clock + w.limit_s, int(w.conn.rank), NEW_GROUP, w.conn, (w, waiting),  # type: ignore[arg-type]
                         self._fire_groups, id(waiting))  # (ties only in its own group's creation)
                for waiting in self._creating.values() for w in waiting.values()
                if w.limit_s is not None and not w.failed and w.conn.active()]

    def _fire_groups(self, due: list[tuple[Creating, dict[int, Creating]]]) -> None:
        """Their turn came first (`deadlines.next_due`): these members' store waits raise."""
        for w, waiting in due:
            self._group_failed(w, waiting)

    def gatherings(self) -> list[Gathering]:
        """The groups whose members wait in their creation, as either side sees them: in the
        simulator the members waiting here (`_creating`), on real Gloo the ranks stalled at the
        store in a group's creation (`RankConn.store_wait`, with the group their stall names)."""
        if not self.rendezvous:
            return self._stalled_gatherings()
        found = []
        for waiting, here in self._waiting_here():
            first = here[0]
            missing = [m for m in first.ranks if m not in waiting]
            limits = {int(w.conn.rank): w.limit_s if w.limit_s is not None else self._default_timeout_s()  # type: ignore[arg-type]
                      for w in here}
            errors = [(int(w.conn.rank), group_timeout(limits[w.conn.rank], w.key,  # type: ignore[index, arg-type]
                                                       first.ranks.index(missing[0]))) for w in here] if missing else []
            found.append(Gathering({int(w.conn.rank): (NEW_GROUP_WAIT, user_line(w.frames) or "?", w.since)  # type: ignore[arg-type]
                                    for w in here}, group_words(first.ranks), missing,
                                   raises_words(errors, min(limits.values()))))
        return found

    def _waiting_here(self) -> Iterator[tuple[dict[int, Creating], list[Creating]]]:
        """Each group in creation (its arrivals, failed ones too: they are not missing) with the
        members that wait in it now (live, their timeout not run out): the status lines' and
        the notes' subject alike."""
        for waiting in self._creating.values():
            here = [w for w in waiting.values() if w.conn.active() and not w.failed]
            if here:
                yield waiting, here

    def _stalled_gatherings(self) -> list[Gathering]:
        """Real Gloo: the ranks stalled at the store in a group's creation, by the group's name."""
        by: dict[str, tuple[list[int], list[RankConn]]] = {}
        for c in self._live():
            store = c.store_wait()
            if store is not None and c.stall_group is not None:
                by.setdefault(str(c.stall_group[0]), ([int(r) for r in c.stall_group[1]], []))[1].append(c)
        return [Gathering({int(c.rank): (*c.store_wait(), c.stall_since) for c in conns},  # type: ignore[misc, arg-type]
                          group_words(members), [m for m in members if m not in {c.rank for c in conns}],
                          timeouts_words(c.stall_limit for c in conns))
                for members, conns in by.values()]

    def group_notes(self) -> list[str]:
        """Why members wait in a group's creation: which members never called it, and where
        they are instead (their process ended, or they wait elsewhere)."""
        notes = []
        for waiting, here in self._waiting_here():
            first = here[0]
            gen = first.conn.gen
            why = []
            for m in (m for m in first.ranks if m not in waiting):
                c = gen.by_rank.get(m) if gen is not None else None
                if c is None or not c.connected:
                    how = exit_words(c.exit) if c is not None and c.exit else "ended"
                    where = f" at {file_line(c.exit['where'])}" if c is not None and c.exit and c.exit.get("where") \
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
