"""The discrete-event core: ranks as simpy processes, collectives matched like real backends.

Collectives are paired per process group by issue order (the per-group sequence number),
exactly as Gloo and NCCL pair them: the engine never looks at what a collective *means*.
When every member of a group has issued sequence number k, the backend rules decide what
happens (`gloo_rules.classify_mismatch`): identical fingerprints complete normally;
fingerprints that differ but that the backend would still pair complete with mixed values
and a finding; others block forever (a hang) or abort a process (SIGABRT). A rank that has
exited fails, on its peers, the unfinished collectives that need it ("Connection closed by
peer", what a real peer sees); on Gloo only the peers whose own messages involve it.

A hang is not a timer: it is the event queue running dry while some rank still waits.
"""

from __future__ import annotations

import bisect
from collections import defaultdict, deque
from typing import Protocol

import simpy

from simdist.engine import gloo_bridge, gloo_rules
from simdist.engine.calls import Call, Instance, P2PKey, RankState, Work
from simdist.engine.exits import GlooExits, quiet_after_abort
from simdist.engine.p2p import GlooP2P
from simdist.engine.results import collective_results, gloo_avg_error, gloo_exchanges_nothing, gloo_local_error
from simdist.engine.timeouts import GlooTimeouts
from simdist.engine.values import Payload
from simdist.limits import OPS
from simdist.report import Finding, RankError, TraceEntry
from simdist.vocab import GLOO_LOCAL_REDUCE_OPS, GLOO_NO_KERNEL_DTYPES


class RankRaised(Exception):
    """A simulated rank raised an exception (the rank's program ends with it)."""

    def __init__(self, type_: str, message: str, category: str = "other", result: Payload | None = None):
        # all of them in args: simpy re-creates a failed event's exception from its args.
        # `result`: what the rank's tensor holds although its op failed (Gloo's integer AVG)
        super().__init__(type_, message, category, result)
        self.error = RankError(type=type_, message=message, category=category)
        self.result = result

    def __str__(self) -> str:
        return f"{self.error.type}: {self.error.message}"


class CostLike(Protocol):
    def collective_time(self, op: str, nbytes: int, ranks: list[int], algo: str | None = None) -> float: ...

    def p2p_time(self, nbytes: int, src: int, dst: int) -> float: ...


def _ghost_entry(op: str, payload: Payload, group: str, origin: str) -> TraceEntry:
    """Entry for an op a dead process would have issued: never recorded in any trace."""
    return TraceEntry(seq=0, op=op, numel=payload.numel, dtype=payload.dtype, group=group, group_size=0, origin=origin)


class Engine(GlooExits, GlooTimeouts, GlooP2P):
    """Holds the simpy environment, process groups and pending operations of one run."""

    def __init__(self, world_size: int, groups: dict[str, list[int]], cost: CostLike, backend: str = "gloo"):
        self.env = simpy.Environment()
        self.world_size = world_size
        self.groups: dict[str, list[int]] = {}
        self._next_seq: dict[str, list[int]] = {}  # per group, per global rank: the last seq issued
        self._member_sets: dict[str, frozenset[int]] = {}
        for name, members in groups.items():
            self.add_group(name, members)
        self.cost = cost
        self.backend = backend
        self.ranks = [RankState(r) for r in range(world_size)]
        self._instances: dict[tuple[str, int], Instance] = {}
        self._open: dict[str, dict[int, Instance]] = defaultdict(dict)  # unfinished, per group
        self._p2p_seq: dict[tuple[str, int], int] = defaultdict(int)
        self._sends: dict[P2PKey, deque[Call]] = defaultdict(deque)
        self._recvs: dict[P2PKey, deque[Call]] = defaultdict(deque)
        # recvs from any source, per (group, dst, tag)
        self._any_recvs: dict[tuple[str, int, int], deque[Call]] = defaultdict(deque)
        self.findings: list[Finding] = []
        # A backstop for `program.budget`'s bound: the trace entries all ranks may record.
        self._entries_left = OPS.value()
        self._dead: list[int] = []  # ranks whose process is gone, ascending
        self._gone_at: dict[int, float] = {}  # when each of them ended
        # A cost model that times a process group's collectives as ProcessGroupGloo runs them
        # (`CostModel.queued`: the calibrated Gloo model) has them run one after another on
        # the group: when each is free again (see _schedule_finish).
        self._queued = bool(getattr(cost, "queued", False))
        self._group_free: dict[str, float] = defaultdict(float)
        self._closed: defaultdict[str, set[int]] = defaultdict(set)  # Gloo's timeout closed these (`timeouts`)

    def add_group(self, name: str, members: list[int]) -> list[int]:
        """Make a process group known (a script creates them as it runs); returns its members,
        the earlier ones if `name` exists. `members` in group-rank order (member i is group rank
        i: torch's `new_group(ranks, sort_ranks=False)` keeps the given order), which results
        (all_gather's, scatter's chunks) follow. Sequence numbers are a list per group, not a
        dict keyed by (group, rank): `issue` is the engine's hottest function."""
        if name not in self.groups:
            self.groups[name] = list(members)
            self._next_seq[name] = [0] * self.world_size
            self._member_sets[name] = frozenset(members)
        return self.groups[name]

    def _dead_member(self, group: str, posted: dict[int, Call], cut: bool) -> int | None:
        """On a backend other than Gloo, the lowest member that died abruptly (SIGABRT; see
        rank_gone) or never posted this: it fails on its peers at once. On Gloo none: a process
        that ended, by SIGABRT too, fails only the calls with a message on its sockets, which the
        message programs tell (`_settle_exited`): ranks 1 and 3 all-gathering 300 int32 while 0
        and 2 all-gather 2 float64 abort both 0 and 2, whoever posts last. Except a collective
        an abort cut off (`cut`: `rank_gone` failed it whole, e.g. the aborted rank's async
        all_reduce in flight): a late poster fails at once with the aborted member, as its first
        message meets the reset socket (2 ranks, torch 2.13; it used to wait for its timeout).
        Looks at the dead ranks only: each issue pays for the ranks that exited, not the group."""
        members = self._member_sets[group]
        if self.backend == "gloo":  # a reset socket fails only the messages on it (`_settle_gone`)
            aborted = (m for m in self._dead if m in members and self.ranks[m].abort_error is not None)
            return next(aborted, None) if cut else None
        for m in self._dead:
            if m in members and (self.ranks[m].abort_error is not None or m not in posted):
                return m
        return None

    # ------------------------------------------------------------------ issuing
    def issue(
        self,
        rank: int,
        op: str,
        payload: Payload,
        *,
        group: str = "WORLD",
        origin: str,
        reduce_op: str | None = None,
        root: int | None = None,
        async_op: bool = False,
    ) -> Work:
        """Issue a collective from `rank`; returns at once (the caller waits on the Work)."""
        rs = self.ranks[rank]
        members = self.groups[group]
        if not rs.alive:
            return Call(rank, op, payload, reduce_op, root, _ghost_entry(op, payload, group, origin), self.env, rs)
        seqs = self._next_seq[group]
        seq = seqs[rank] = seqs[rank] + 1
        self._entries_left -= 1  # `_record_one`, inline
        if self._entries_left < 0:
            self._over_budget()
        numel, dtype = payload.numel, payload.dtype
        # positional: this is the engine's hottest line (see TraceEntry for the field order)
        entry = TraceEntry(seq, op, numel, dtype, group, len(members), origin, reduce_op, root,
                           None, async_op, rs.phase, rs.iteration, self.env._now)
        rs.trace.append(entry)
        call = Call(rank, op, payload, reduce_op, root, entry, self.env, rs)
        ikey = (group, seq)
        inst = self._instances.get(ikey)
        sig = (op, numel, dtype, root)  # what the messages depend on (`Instance.mixed`)
        if inst is None:
            inst = self._instances[ikey] = Instance(group, seq, members, sig, reduce_op)
            self._open[group][seq] = inst
        elif sig != inst.sig:
            inst.mixed = True
        elif reduce_op != inst.reduce_op:
            inst.reduce_differs = True
        calls = inst.calls
        calls[rank] = call
        gloo = self.backend == "gloo"
        # (gloo_local_error is None but for a reduce op Gloo may refuse, no kernel or an all_to_all)
        if gloo and (reduce_op in GLOO_LOCAL_REDUCE_OPS or dtype in GLOO_NO_KERNEL_DTYPES or op == "all_to_all") \
                and (local := gloo_local_error(call, members)) is not None:
            # failed before the wire: peers that do exchange wait for it forever (see _match),
            # and fail only when its process goes (rank_gone: a stuck instance is not "posted")
            call.settle(False, RankRaised("RuntimeError", local, "other"))
            inst.stuck = True
        elif not numel and gloo and gloo_exchanges_nothing(call):  # numel first: hot path
            self._complete_call(call, payload)  # no wire: done at issue, peers as for a local error
            inst.stuck = True
        elif self._closed and (shut := self.closed_error(call, group, members)) is not None:
            self._fail(call, *shut)  # Gloo's timeout closed this group's pairs here or at a peer
            inst.stuck = True
        if self._dead and (dead := self._dead_member(group, calls, inst.finished)) is not None:
            self._fail_instance(inst, dead)
        elif len(calls) == len(members):
            del self._instances[ikey]  # complete: no late caller can look it up again
            self._match(inst)
        elif (self._dead or inst.mixed) and gloo:
            self._settle_gone(inst)
        return call

    def _record_one(self) -> None:
        self._entries_left -= 1
        if self._entries_left < 0:
            self._over_budget()

    def _over_budget(self) -> None:
        OPS.check(OPS.value() + 1, "simulation", f"the ranks have recorded more than {OPS.value():,} "
                                                     "collectives (the run does more than its scenario's estimate)")

    # ------------------------------------------------------------------ matching
    def _match(self, inst: Instance) -> None:
        inst.matched = True
        calls = [inst.calls[m] for m in inst.members]
        if inst.stuck:  # a member ended before it exchanged anything (gloo_local_error, gloo_exchanges_nothing)
            if self._dead and self.backend == "gloo" and not all(c.done for c in calls):
                self._settle_gone(inst)  # or aborted, exited: the last poster's messages decide
            if all(c.done for c in calls):
                inst.finished = True
                self._open[inst.group].pop(inst.seq, None)
            return
        verdict = gloo_bridge.classify(calls, len(inst.members), inst.alike)
        if verdict.kind != "ok":
            self.findings.append(gloo_bridge.finding(inst.group, inst.seq, calls, verdict))
        if verdict.kind in ("ok", "silent"):
            self._schedule_finish(inst, calls, inst.members)
            return
        # hang / abort: the backend's per-rank outcome (a rank whose own messages all matched
        # completes even though a peer blocks; see gloo_rules)
        outcomes = verdict.rank_outcomes
        done = [m for m in inst.members if outcomes.get(m) == "ok"]
        inst.stuck = True
        # who fails whose exit: the ranks left waiting on the peers named; one that completes, or
        # that its own message aborts, waits on no one (`quiet_after_abort`)
        for m in inst.members:
            inst.calls[m].waits_on = frozenset() if quiet_after_abort(verdict, m) else verdict.waits_on.get(m)
        if verdict.kind == "abort":
            for m in done:
                self._deliver(inst.calls[m], collective_results(calls, self.backend == "gloo")[m])
            for r in verdict.aborting_ranks:
                self.abort_rank(r, *gloo_rules.abort_words(verdict, r), inst.calls[r].entry)
            dead = verdict.aborting_ranks[0] if verdict.aborting_ranks else inst.members[0]
            for m in inst.members:
                if outcomes.get(m) == "peer_error":
                    self._fail_call(inst.calls[m], dead)
            return
        if done:
            self._schedule_finish(inst, calls, done)

    def _schedule_finish(self, inst: Instance, calls: list[Call], ranks: list[int]) -> None:
        nbytes = calls[0].payload.nbytes if inst.alike else max(c.payload.nbytes for c in calls)
        dur = self.cost.collective_time(calls[0].op, nbytes, inst.members)
        if self._queued:  # after the group's earlier collectives: they share its sockets and worker threads
            start = max(self.env.now, self._group_free[inst.group])
            self._group_free[inst.group] = start + dur
            dur += start - self.env.now
        ev = self.env.timeout(dur)
        ev.callbacks.append(lambda _ev, inst=inst, ranks=ranks: self._finish(inst, ranks))

    def _complete_call(self, c: Call, result: Payload) -> None:
        c.complete(result, self.env.now)

    def _deliver(self, c: Call, result: Payload) -> None:
        """Complete a collective's call with its result, or fail it where the backend raises
        only after the collective ran (Gloo's integer AVG): its tensor holds `result` then,
        its peers are unaffected, and later collectives pair as usual."""
        # (gloo_avg_error is None unless the call asked for AVG: the test first, per rank-collective)
        error = gloo_avg_error(c) if c.reduce_op == "avg" and self.backend == "gloo" else None
        if error is None:
            self._complete_call(c, result)
        elif not c.event.triggered:
            c.entry.t_done = self.env.now
            c.event.fail(RankRaised("RuntimeError", error, "other", result))
            c.event.defused = True

    def _finish(self, inst: Instance, ranks: list[int]) -> None:
        if inst.finished:
            return
        gloo = self.backend == "gloo"
        calls = inst.calls
        results = collective_results([calls[m] for m in inst.members], gloo, inst.alike)
        now = self.env._now
        for m in ranks:
            c = calls[m]
            if c.reduce_op == "avg" and gloo:  # Gloo's integer AVG may fail it (`_deliver`)
                self._deliver(c, results[m])
            else:
                c.complete(results[m], now)  # (`_deliver`'s common case, one call per rank-collective)
        if len(ranks) == len(inst.members):
            inst.finished = True
            self._open[inst.group].pop(inst.seq, None)

    # ------------------------------------------------------------------ failure
    def _fail_call(self, call: Call, dead: int) -> None:
        if call.done:
            return
        # Gloo's wording: a peer that exited closes its sockets; one killed by SIGABRT resets them
        how = "reset" if self.ranks[dead].abort_error is not None else "closed"
        err = RankRaised("RuntimeError", f"Connection {how} by peer (rank {dead} has exited)", "peer_lost")
        call.entry.t_done = self.env.now
        call.settle(False, err)

    def _fail_instance(self, inst: Instance, dead: int) -> None:
        inst.finished = True
        self._open[inst.group].pop(inst.seq, None)
        for m, c in inst.calls.items():
            if self.ranks[m].alive:
                self._fail_call(c, dead)

    def _fail_waiting(self, inst: Instance, dead: int) -> None:
        """`dead` is gone: of a stuck collective, the calls that wait on it fail (`Call.waits_on`;
        Gloo: the pair's exception reaches only the buffers with an op pending with it), the
        others keep waiting on their live peers. Finished once no live member waits."""
        for m, c in inst.calls.items():
            if not c.done and self.ranks[m].alive and (c.waits_on is None or dead in c.waits_on):
                self._fail_call(c, dead)
        if all(not self.ranks[m].alive or (m in inst.calls and inst.calls[m].done) for m in inst.members):
            inst.finished = True
            self._open[inst.group].pop(inst.seq, None)

    def rank_gone(self, rank: int, abrupt: bool = False, at: float | None = None) -> None:
        """`rank`'s process has ended: everything unfinished that needs it fails on its peers.

        A process that ends normally or by an exception takes milliseconds or more to unwind
        (record, tear down), far longer than its peers need to post their side, so on Gloo the
        collectives it had already posted (async ones included) still complete: they stay
        matchable here (mostly: a peer whose part comes after the sockets closed loses it on
        real Gloo, which `simdist.races.TeardownRace` names). Collectives it never posted fail only on the peers whose messages
        involve it (Gloo, `_settle_exited`; other backends: on all of them), ones that can
        never complete on every peer. An abrupt death (SIGABRT) cuts everything off.
        """
        rs = self.ranks[rank]
        if not rs.alive:
            return
        rs.alive = False
        bisect.insort(self._dead, rank)
        # when it ended, on the clock its peers' calls were issued on (`entry.t_issue`): a script's
        # coordinator keeps the ranks' clocks itself (`at`) and runs the engine at zero cost
        self._gone_at[rank] = self.env.now if at is None else at
        for gname, members in self.groups.items():
            if rank not in members:
                continue
            for inst in list(self._open[gname].values()):
                if inst.stuck:
                    self._fail_waiting(inst, rank)
                    continue
                if not abrupt and rank in inst.calls:
                    continue  # posted before the exit: peers can still complete it
                if not abrupt and not inst.matched and self.backend == "gloo":
                    self._settle_gone(inst)  # never posted by it
                    continue
                self._fail_instance(inst, rank)
        self._fail_p2p_of(rank)

    def abort_rank(self, rank: int, what: str, why: str, fatal: TraceEntry | None = None) -> None:
        """Gloo's I/O thread threw `what` (its words: the rank prints them, `rank.client`; `why`:
        the simulator's account, in global ranks, which only the report's message adds):
        std::terminate -> SIGABRT. The process dies at once. What
        it posted after `fatal` (the collective whose message killed it) at this very instant
        may or may not beat the signal (a race: docs/real-backend.md): its trace keeps only
        what is certain, and `compare` accepts a longer real trace for an aborted rank."""
        rs = self.ranks[rank]
        if not rs.alive:
            return
        rs.abort_error = RankError("gloo::EnforceNotMet", f"{what} (std::terminate: SIGABRT; {why})", "gloo_abort")
        if fatal is not None and (k := next((i for i, e in enumerate(rs.trace) if e is fatal), None)) is not None:
            rs.trace[k + 1:] = [e for e in rs.trace[k + 1:] if e.t_issue < self.env.now]
        proc = rs.process
        # deferred: the aborting rank may be the process that is running right now
        self.env.timeout(0).callbacks.append(lambda _ev: proc.interrupt("abort") if proc is not None and proc.is_alive
                                             else None)
        self.rank_gone(rank, abrupt=True)

    def _fail(self, call: Call, message: str, category: str) -> None:
        """`GlooTimeouts`' failures: `call` raises `message` (a RuntimeError) on its rank."""
        call.entry.t_done = None
        call.settle(False, RankRaised("RuntimeError", message, category))

    # ------------------------------------------------------------------ quiescence
