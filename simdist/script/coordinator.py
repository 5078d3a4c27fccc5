"""The coordinator: the simdist side of a script run, driving the engine for every rank.

Rank processes connect to a Unix socket and send what their process groups do; the coordinator
issues each operation on the shared `simdist.engine.core.Engine` (pairing per group by sequence
number, the backend's rules on mismatches, exact result values) and answers with the result
bytes when the operation completes.

Hang detection needs no timer: when every live rank is blocked in operations that have not
completed (a visible `wait()`, or idle on futures torch waits for in C++; see `rank.client`)
and none has a thread that could still post (the rank's claim, `ranks.Claim`: a thread that
sleeps or computes may post later without a message meanwhile), no message can arrive that
would let one complete, so the run hangs. On Gloo, `settle_absent`
first completes what Gloo completes without an absent member, and a group's own timeout, where
the script set one, ends the waits due first (`simdist.script.deadlines`); only a run with
none left hangs.

Rank exits follow the backend the script asked for (or `backend=` overrides): on Gloo a peer
that exits makes its partners' unfinished collectives fail ("Connection closed by peer",
`Engine.rank_gone`); on NCCL nothing tells them, so they stay blocked: a hang. A rank that
destroys its default group leaves its generation there (on Gloo its pairs close then).

A script may initialise its default group several times (`mp.spawn` twice, or init again
after destroy): each life is a generation with its own engine (`simdist.script.generations`).
"""

from __future__ import annotations

import dataclasses
import functools
import selectors
import socket
import time
from typing import Any

import numpy as np

from simdist.engine.core import RankRaised
from simdist.engine.values import Splits
from simdist.frames import Frame, phase_of, script_origin
from simdist.procs import Watchdog
from simdist.script import deadlines, payloads, wire
from simdist.script.barriers import StoreBarrierMixin
from simdist.script.expiry import GlooTimeoutsMixin
from simdist.script.generations import Generation, GenerationsMixin
from simdist.script.groups import Creating, GroupsMixin
from simdist.script.initwatch import InitWatchMixin
from simdist.script.keystore import KeyStoreMixin
from simdist.script.ranks import Block, OpRecord, RankConn, raw_frames
from simdist.script.rendezvous import RendezvousMixin
from simdist.script.scriptclocks import ScriptClocksMixin
from simdist.script.stalls import Ending, StalledMixin, StallRule
from simdist.script.timedwakes import TimedWakesMixin
from simdist.vocab import P2P_OPS, reduce_op_of, root_of

POLL_S = 0.05
# How long a hung real run's ranks are given to answer the request for their record before
# they are killed (`collect_records`); the wait ends as soon as all have answered. A process's
# first Flight Recorder dump symbolizes its Python stacks, which imported torch._dynamo (2-3 s
# on a loaded 2-core host) until `rank.flight._no_inductor_lookup`; a dump takes milliseconds
# (the stall rule's own dump, `rank.stall`, may still import it).
RECORD_WAIT_S = 10.0


@functools.lru_cache(maxsize=4096)
def _site(dtype: str, raw: tuple[tuple[Any, ...], ...]) -> tuple[list[Frame], list[bool], str]:
    """Frames and origin of a call site (raw frames: file, line, function, user's?). The same
    sites recur every iteration and, in a fuzzer's search, every run of the script: cached for
    the process, as the source files' parses behind them are (`simdist.frames`). Read only."""
    frames, user = raw_frames(list(raw))
    return frames, user, script_origin(frames, user, dtype)


class Coordinator(GlooTimeoutsMixin, GenerationsMixin, GroupsMixin, RendezvousMixin, StoreBarrierMixin,
                  KeyStoreMixin, StalledMixin, InitWatchMixin, TimedWakesMixin, ScriptClocksMixin):
    def __init__(self, listener: socket.socket, cost_factory: Any, *, backend: str | None = None,
                 measure_compute: bool = True, batches: list[int] | None = None, stalls: StallRule | None = None,
                 rendezvous: bool = True):
        self.listener = listener
        self.cost_factory = cost_factory
        self.backend: str | None = backend
        self.measure_compute = measure_compute
        self.gens: list[Generation] = []  # the default group's lives, oldest first (`generations`)
        self.conns: list[RankConn] = []
        self.requested: list[str] = []
        self.protocol_errors: list[str] = []
        self.batches = batches or []  # --batches caps: one per rank, or one for every rank
        self.stalls = stalls  # real Gloo: the early hang verdict's rule (None: the watchdog alone)
        self.rendezvous = rendezvous  # simulated: init waits for the world here (real Gloo: at the store)
        self.no_init: dict[int, dict[str, Any]] = {}  # rank -> how its process ended before its init (`rendezvous`)
        self.spawn_left: list[dict[str, Any]] = []  # mp.spawn's children that ended before init (`initwatch`)
        self.input_error: str | None = None  # bad input found only once ranks said who they are
        # (group, rank) -> that rank's Gloo timeout for the group (s), where modelled (`deadlines`): each
        # process gives its own ProcessGroupGloo its timeout, so ranks of one group may differ
        self.timeouts: dict[tuple[str, int | None], float] = {}
        self.long_limits: set[tuple[str, int | None]] = set()  # ... of those, torch's default or longer (`OpRecord.long`)
        self.unnamed: set[str] = set()  # groups FR records with no name (TORCH_DISTRIBUTED_DEBUG=DETAIL: `detail`)
        self.rank_notes: list[tuple[int | None, str]] = []  # what a rank said of its end before it (`detail`)
        self.expired: list[deadlines.Expiry] = []  # the waits Gloo's timeout ended, in order
        self._timed: list[tuple[RankConn, OpRecord]] = []  # ops with a deadline, not known to be done
        self._creating: dict[str, dict[int, Creating]] = {}  # group name -> its members waiting in its creation
        # the run's end was decided (a hang verdict, the watchdog, Ctrl-C: `collect_records`): the stalls it
        # stood on stand for the report; one that ends now is the rank computing its record's answer (its
        # Flight Recorder's dump), not progress
        self._judged = False
        self.sel = selectors.DefaultSelector()
        self.sel.register(listener, selectors.EVENT_READ, None)

    @property
    def world_size(self) -> int:
        """The report's ranks: the largest generation's world."""
        return max((g.world_size for g in self.gens), default=0)

    def members(self) -> list[RankConn]:  # every membership of every generation
        return [c for g in self.gens for c in g.by_rank.values()]

    # ------------------------------------------------------------------ loop
    def serve(self, launched_done: Any, dog: Watchdog, exits: Any = None, ended: Any = None) -> Ending:
        """Serve until the processes are done, a hang is proven, or the watchdog fires.
        `launched_done()` says whether every process the launcher started has exited;
        `exits`: the fork server that forked the processes, if one did: its reports of their
        exits wake the loop (`ForkServer.fileno`, read with `pump`); else `launched_done` is
        polled every `POLL_S`, and the run's end waits that long after its last connection.
        `ended()`: the ranks whose launched process has ended (torchrun-style; `rendezvous`).

        Progress for the watchdog is any message of a rank but its printed lines (a rank
        that prints in a loop without communicating is spinning); until every rank has
        said who it is the run is starting (importing torch on a busy host takes long)."""
        exits = exits if exits is not None and exits.fileno() >= 0 else None  # (a server that is gone: polled)
        self.never_joins = ended or set
        if exits is not None:
            self.sel.register(exits, selectors.EVENT_READ, exits)
        try:
            with np.errstate(all="ignore"):  # values overflow as they do in torch, silently
                return self._serve(launched_done, dog)
        except KeyboardInterrupt:  # Ctrl-C at a terminal: the run ends with its report, as it stands
            if self.init_watch is None or self.init_watch.status is None:
                raise
            return Ending("interrupted", time.time())
        finally:
            if exits is not None:
                self.sel.unregister(exits)

    def _serve(self, launched_done: Any, dog: Watchdog) -> Ending:
        while True:
            for key, _ in self.sel.select(POLL_S):
                if key.data is None:
                    self._accept()
                elif not isinstance(key.data, RankConn):  # the fork server reported an exit
                    key.data.pump(0.0)
                elif self._read(key.data):
                    dog.progressed()
            self._pump()
            self._init_timeouts()
            if launched_done() and not any(c.connected for c in self.conns):
                return Ending("finished", time.time())
            if self._hung() and not self._expire_next():  # the wait due first ends, whatever its kind
                return Ending("hang", time.time(), self._last_event())
            self._expire_before_wakes()  # ... and one due before a thread in a timed wait wakes (or that thread wakes)
            self._expire_reached()  # ... and one left to the wall clock that it has got to
            if (stalled := self._stalled() or self._init_stalled()) is not None:
                return stalled
            self._groups_gather()
            if dog.fired(starting=self._starting()):
                return Ending("timeout", time.time())

    def _accept(self) -> None:
        sock, _ = self.listener.accept()
        sock.setblocking(True)
        conn = RankConn(sock)
        self.conns.append(conn)
        self.sel.register(sock, selectors.EVENT_READ, conn)

    def _read(self, conn: RankConn) -> bool:
        """Handle what arrived; whether it was progress (anything but printed lines)."""
        try:
            data = conn.sock.recv(1 << 20)
        except OSError:
            data = b""
        if not data:
            self._closed(conn)
            return True
        progress = False
        for header, buffers in conn.decoder.feed(data):
            self._handle(conn, header, buffers)
            # a rank sleeping in a loop spins; a claim says only which of its threads could post
            progress = progress or header["t"] not in ("out", "sleep", "stall", "busy", "twait", "woke")
        return progress

    def _send(self, conn: RankConn, header: dict[str, Any], buffers: list[Any] | tuple = ()) -> None:
        if not conn.connected:
            return
        try:
            wire.send(conn.sock, header, buffers)
        except OSError:
            return  # the process is gone; its connection's end is seen by the reader
        if header["t"] in ("done", "waited"):  # may wake a thread: the rank's claim must count it
            conn.claim.sent += 1

    def _pump(self) -> None:
        """Let the engines finish everything they can (completions call back into `_completed`)."""
        for g in self.gens:
            self._pump_one(g)
        self._kv_release()  # then the store calls held for peers that have caught up (`keystore`)

    def _pump_one(self, g: Generation) -> None:
        g.engine.env.run()
        for r, rs in enumerate(g.engine.ranks):
            conn = g.by_rank.get(r)
            if rs.abort_error is not None and conn is not None and conn.active() and not conn.abort_sent:
                conn.abort_sent = True
                self._send(conn, {"t": "abort", "detail": rs.abort_error.message.split(" (std::terminate")[0]})

    # ------------------------------------------------------------------ messages
    def _handle(self, conn: RankConn, h: dict[str, Any], buffers: list[bytearray]) -> None:
        kind = h["t"]
        if "busy" in h:  # the rank's claim: which of its threads could still post (`rank.client`)
            conn.claim.told(h["busy"], time.time())
        if kind == "op":
            self._op(conn, h, buffers[0] if buffers else None)
        elif kind == "wait":
            self._wait(conn, h)
        elif kind == "idle":
            self._idle(conn, h)
        elif kind == "fut":
            if (rec := conn.ops.get(int(h["id"]))) is not None:
                conn.waited_on(rec)
        elif kind == "batches":
            conn.batches, conn.longest_epoch, conn.capped = int(h["n"]), int(h["longest"]), int(h["capped"])
            conn.advance(h, self.measure_compute)  # yielded after the compute (or wait) before it
            conn.batches_at.append((conn.clock, conn.batches))
        elif kind == "out":
            (conn.stdout if h["s"] == "stdout" else conn.stderr).append(h["x"])
            if h["s"] == "stdout":
                conn.advance(h, self.measure_compute)  # after a failed wait's failure, and the compute before it
                conn.stdout_at.append(conn.clock)  # (`script.agent`: a line after the agent's SIGTERM never came)
        elif kind == "init":
            self._init(conn, h)
        elif kind == "destroy":
            self._destroyed(conn, h)
        elif kind == "group":
            self._group(conn, h)
        elif kind == "barrier":  # TORCH_DIST_INIT_BARRIER=1's store barrier (`barriers`)
            self._store_barrier(conn, h)
        elif kind == "kv":  # the default store's operations (`keystore`)
            self._kv(conn, h)
        elif kind == "exit":
            conn.advance(h, self.measure_compute)
            conn.exit = h
            conn.exit_at = time.time()
            self._overdue(conn)
        elif kind == "note":  # why the rank is about to die (`rank.pgwrapper`'s SIGSEGV)
            self.rank_notes.append((conn.rank, str(h["x"])))
        elif kind == "record":  # the answer to `collect_records`' request
            conn.record = h
        elif kind == "stall" and not self._judged:  # real Gloo: a stall in a torch.distributed wait began or ended (`rank.stall`)
            conn.stall_since, conn.stall_limit, conn.stall_in = h.get("since"), h.get("limit"), h.get("in")
            conn.stall_group = h.get("grp")
        elif kind in ("twait", "woke"):  # a thread of it begins a timed wait, or its timer ended it (`rank.timedwait`)
            conn.timed_wait(h, self.measure_compute)
        elif kind == "sleep":
            conn.advance(h, self.measure_compute)
            if "w" not in h or "b" in h:  # "w": a wait for a child, "b" as it begins (`rank.childwait`)
                conn.sleeps.append((conn.clock, h.get("frames") or []))
            if "w" in h:
                conn.child_wait(h, self.measure_compute)
            else:
                conn.sleep(float(h["s"]))
            if "n" in h:  # told as a timed wait (`rank.timedwait.sleep`): it ends at the clock now
                conn.timed_wait(h, self.measure_compute)
            self._overdue()

    def _op(self, conn: RankConn, h: dict[str, Any], data: bytearray | None) -> None:
        assert conn.gen is not None and conn.rank is not None
        engine, timeline = conn.gen.engine, conn.gen.timeline
        conn.advance(h, self.measure_compute)
        conn.unblock()
        self._overdue(conn)  # before it posts: what timed out waiting for it meets a closed pair
        rank, op, group = conn.rank, h["op"], h["g"]
        raw = h.get("frames") or []
        frames, user, origin = _site(h["dt"], tuple(tuple(f) for f in raw))
        payload = payloads.to_payload(data, h["dt"], int(h["n"]))
        if h.get("splits"):
            send, recv, given = h["splits"]
            payload = dataclasses.replace(payload, meta=Splits(tuple(int(n) for n in send), tuple(int(n) for n in recv),
                                                               bool(given)))
        if op in P2P_OPS:
            peer = None if h.get("peer") is None else int(h["peer"])  # None: a recv from any source
            work = engine.p2p(rank, op, payload, peer, tag=int(h.get("tag") or 0), origin=origin,
                              group=group, t_issue=conn.clock)
            members = [rank, peer] if op == "send" else [peer, rank]  # type: ignore[list-item]
        else:
            work = engine.issue(rank, op, payload, group=group, origin=origin, reduce_op=reduce_op_of(op, h.get("ro")),
                                root=root_of(op, h.get("root")), async_op=bool(h.get("async")))
            members = engine.groups[group]
        entry = work.call.entry
        if h.get("hidden"):  # Gloo's own messages of a call (monitored_barrier): not in the trace, as on Gloo
            engine.ranks[rank].trace.remove(entry)
            entry.within = str(h["hidden"])
        entry.t_issue = conn.clock
        entry.phase, entry.iteration = phase_of(frames), None
        rec = OpRecord(rank, int(h["id"]), entry, frames, user, bool(h.get("want", True)), members, call=work.call,
                       long="to" not in h and (group, rank) in self.long_limits, proc=h.get("p"))
        limit = h.get("to", self.timeouts.get((group, rank)))  # the op's own (monitored_barrier's) or its group's
        if limit is not None:  # a p2p's group timeout starts at its wait, as Gloo's (`RankConn.waited_on`)
            rec.limit_s = float(limit)
            rec.deadline = None if op in P2P_OPS and "to" not in h else entry.t_issue + rec.limit_s
            self._timed.append((conn, rec))
        conn.ops[rec.id] = rec
        timeline.issued(rank, entry, int(h.get("tag") or 0))
        work.call.event.callbacks.append(lambda ev, conn=conn, rec=rec: self._completed(conn, rec, ev))
        if h.get("wait", not h.get("async", True)):  # the caller waits at once (dist.all_reduce(..., async_op=False))
            conn.waited_on(rec)
            conn.block = Block([rec.id], time.time(), raw)
        if rec.deadline is not None:  # a peer may be past it already
            self._overdue()

    def _wait(self, conn: RankConn, h: dict[str, Any]) -> None:
        conn.advance(h, self.measure_compute)
        rec = conn.ops.get(int(h["id"]))
        if rec is None:
            return
        conn.waited_on(rec)
        if h.get("to") is not None:  # a wait with its own timeout (monitored_barrier's rank 0)
            rec.deadline, rec.limit_s = conn.clock + float(h["to"]), float(h["to"])
            self._timed.append((conn, rec))
        if h.get("wt") and not rec.done:  # the user's Work.wait(timeout=...)
            conn.wait_until = (rec, conn.clock + float(h["wt"]))
        if not rec.done:
            conn.block = Block([rec.id], time.time(), h.get("frames") or [])
        self._overdue()

    def _idle(self, conn: RankConn, h: dict[str, Any]) -> None:
        recs = [conn.ops[i] for i in h["ids"] if i in conn.ops]
        for rec in recs:
            conn.waited_on(rec)
        if recs and all(not r.done for r in recs):
            conn.block = Block([r.id for r in recs], float(h.get("since") or time.time()), h.get("frames") or [])
            self._overdue()

    def _completed(self, conn: RankConn, rec: OpRecord, ev: Any) -> None:
        assert conn.gen is not None
        rec.done = True
        entry = rec.entry
        if ev.ok:
            if entry.op == "recv" and None in rec.members:  # from any source: now known
                rec.members = [entry.peer, rec.rank]  # type: ignore[list-item]
            entry.t_done = conn.gen.timeline.completion(entry, rec.members, ev.value.nbytes)
            data = payloads.to_bytes(ev.value) if rec.want_data else None
            done = {"t": "done", "id": rec.id} if entry.op != "recv" else {"t": "done", "id": rec.id, "src": entry.peer}
            self._send(conn, done, [data] if data is not None else [])
        else:
            err = ev.value
            message = str(err.error.message) if isinstance(err, RankRaised) else str(err)
            entry.t_done = None
            rec.ended_at = conn.gen.lost_at(message)  # its waiter's clock catches up (`RankConn.advance`)
            # an op that failed after it ran (Gloo's integer AVG) still wrote its tensor
            held = err.result if isinstance(err, RankRaised) and rec.want_data else None
            data = payloads.to_bytes(held) if held is not None else None
            self._send(conn, {"t": "done", "id": rec.id, "error": message}, [data] if data is not None else [])
        if conn.block is not None and rec.id in conn.block.ids:
            conn.unblock()
        if conn.wait_until is not None and conn.wait_until[0] is rec:
            conn.wait_until = None

    def _closed(self, conn: RankConn) -> None:
        if not conn.connected:
            return
        conn.connected = False
        conn.ended_at = time.time()
        try:
            self.sel.unregister(conn.sock)
        except (KeyError, ValueError):
            pass
        conn.sock.close()
        conn.advance(None, self.measure_compute)
        if conn.rank is None or conn.gen is None or conn.destroyed:
            return  # a destroyed group's pairs closed at the destroy (`_destroyed`)
        if self.backend == "gloo":
            killed = conn.exit is None  # no word from it: killed by a signal, its sockets reset
            conn.gen.engine.rank_gone(conn.rank, abrupt=killed, at=conn.clock)
        self._pump()

    # ------------------------------------------------------------------ hang
    def collect_records(self, wait_s: float = RECORD_WAIT_S) -> None:
        """Before the ranks of a hung real run are killed: ask each that is still there and
        has not reported its end for its record (its reader thread answers, `rank.client`:
        Flight Recorder, p2p operations, the user's line where its main thread stands), and
        read the answers for at most `wait_s`. A rank that does not answer keeps no record."""
        self._judged = True
        asked = [c for c in self.members() if c.connected and c.exit is None]
        for c in asked:
            self._send(c, {"t": "dump"})
        deadline = time.monotonic() + wait_s
        while any(c.connected and c.exit is None and c.record is None for c in asked):
            left = deadline - time.monotonic()
            if left <= 0:
                return
            for key, _ in self.sel.select(min(left, POLL_S)):
                if key.data is None:
                    self._accept()
                else:
                    self._read(key.data)

    def _live(self) -> list[RankConn]:
        """Ranks that may still communicate. On NCCL a rank that announced its exit is gone
        for its peers already; on Gloo its peers learn only when its process ends."""
        leaving_counts = self.backend == "nccl"
        return [c for c in self.members() if c.active() and not (leaving_counts and c.exit is not None)]

    def _last_event(self) -> float:
        """When the hang became certain: the last rank blocking or (NCCL) announcing its exit."""
        live = self._live()
        times = [max(c.block.since, c.claim.at) for c in live if c.block is not None]
        times += [c.init_wait.since for c in live if c.init_wait is not None]
        times += [c.exit_at for c in self.members() if c not in live and c.exit_at is not None]
        times += [c.ended_at for c in self.members() if c.ended_at is not None]
        return max(times)

    def _hung(self, timed: bool = False) -> bool:
        """Every generation has all its ranks or lacks only ranks that will never come (a missing
        one may still come), no process is on its way out (`_lingering`), and every live
        membership is blocked in operations that have not completed (or in init): no message can
        come (`timed`: or blocked but for threads in a timed wait, `RankConn.wake_at`)."""
        if not self.gens or not all(g.complete() or self._unjoinable(g) for g in self.gens) or self._lingering():
            return False
        live = self._live()
        if not live or not all(c.blocked() or (timed and c.wake_at() is not None) for c in live):
            return False
        if self.backend == "gloo" and any([g.engine.settle_absent() for g in self.gens]):
            self._pump()
            return False
        return True

    def _lingering(self) -> bool:
        """A process whose end is still to come and is reported as it comes, so the run is not
        over: one that destroyed its default group and lives on, in no generation and without
        announcing its exit (it may yet print, write files or exit with an error; on real Gloo
        it is not stalled either: `simdist.script.stalls`), or one told to abort (Gloo's I/O
        thread threw: it ends by SIGABRT; a hang proven before that reported it "hang")."""
        return any(c.connected and c.exit is None and (c.destroyed or c.abort_sent) for c in self.members())

    def close(self) -> None:
        for c in self.conns:
            if c.connected:
                c.sock.close()
        self.sel.close()
