"""What a process that ended does to the collectives it did not take part in, on Gloo.

Gloo has no all-or-nothing rule for a collective a member never posted: each rank fails or
completes by its own messages (`gloo_bridge.absent_outcomes`): a rank whose messages
involve the gone member fails, a broadcast's rank fed by the root completes. These are the
engine's methods for it, kept apart from matching because they are one rule with its own
timing questions (when a failure is final, when to wait for members still to post).
"""

from __future__ import annotations

import dataclasses

from simdist.engine import gloo_bridge, gloo_rules
from simdist.engine.calls import Call, Instance, RankState
from simdist.engine.values import Payload, chunk_payload
from simdist.report import Finding, TraceEntry


def quiet_after_abort(verdict: gloo_rules.MismatchVerdict, m: int) -> bool:
    """Whether member `m`'s call waits on no peer once `verdict` has aborted ranks, so that no
    peer's reset fails it: its messages all went through (a broadcast's root that wrote to the
    aborting receiver, a sibling fed by the root), or its own message aborts it. Gloo's reset
    of an aborted peer's pairs reaches only the buffers with an op pending on those pairs: ranks
    0 and 2 of tests/scripts/subgroup_mismatch.py bc both receive the root's 8 bytes into a
    4-byte buffer and both abort; the simulator failed the second with "Connection reset by
    peer" by the first's abort (its process raised, then aborted: a traceback real Gloo never
    prints, and its `what()` lost in torch's excepthook, 1 run in ~8)."""
    return verdict.rank_outcomes.get(m) == "ok" or m in verdict.aborting_ranks


class GlooExits:
    """Mixed into `core.Engine`; reads its ranks, groups and dead list, and completes or fails
    calls through its `_complete_call` / `_fail_call`."""

    ranks: list[RankState]
    findings: list[Finding]
    _dead: list[int]
    _gone_at: dict[int, float]
    _member_sets: dict[str, frozenset[int]]
    _closed: dict[str, set[int]]  # group -> ranks whose context Gloo's timeout closed (`timeouts`)
    _instances: dict[tuple[str, int], Instance]
    _open: dict[str, dict[int, Instance]]

    def _complete_call(self, c: Call, result: Payload) -> None:
        raise NotImplementedError

    def _fail_call(self, call: Call, dead: int) -> None:
        raise NotImplementedError

    def _gone_absent(self, group: str, posted: dict[int, Call]) -> dict[int, float]:
        """The members whose process ended without taking part, and when: never posted, or
        posted and failed (a rank's messages stop where it failed, e.g. a root whose first
        send met a closed socket never sends the rest). Not one whose call ran out of time
        (Gloo's timeout, `_timed_out`): its messages went out up to the wait that ran out, and
        its peers' receives got them before its pairs closed."""
        return {m: self._gone_at[m] for m in self._dead
                if m in self._member_sets[group] and (m not in posted or (posted[m].ok is False
                                                                          and not _timed_out(posted[m])))}

    def abort_rank(self, rank: int, what: str, why: str, fatal: TraceEntry | None = None) -> None:
        raise NotImplementedError

    def _settle_gone(self, inst: Instance) -> None:
        """On Gloo, a collective that members whose process ended never posted: the posted
        ranks whose messages involve them fail now (their sockets are closed: Gloo fails
        them as they post, or as the peer goes); the rest is settled once every live
        member has posted (or when nothing more can happen, `settle_absent`). Posted calls
        that differ exchange their messages before the others post: a message longer than
        its receive aborts the receiver now (the ring's first segments need no one else)."""
        gone = self._gone_absent(inst.group, inst.calls)
        if gone or inst.mixed:
            missing = tuple(m for m in inst.members if m not in inst.calls and m not in gone)
            self._settle_exited(inst, gone, missing, failures_only=bool(missing))

    def note_waits(self, inst: Instance) -> None:
        """A collective some member has not posted got stuck (a posted call's wait ran out):
        each posted call left waits on the peers its own messages name (`Call.waits_on`),
        judged with the posted calls' messages exchanged (the timed-out one's went out before
        its wait ran out: Gloo moves a message once both ends posted) and the unposted members
        as a different kind, so its closure (`timeouts._close`), and later exits and timeouts,
        fail only the calls with a message pending with that rank; a call whose messages all
        went through completes (real Gloo had completed it before the wait ran out)."""
        gone = self._gone_absent(inst.group, inst.calls)
        calls = [c for m, c in inst.calls.items() if m not in gone]
        missing = [m for m in inst.members if m not in inst.calls and m not in gone]
        verdict = gloo_bridge.absent_outcomes(calls, inst.members, gone, missing)
        for m, call in inst.calls.items():
            if call.done or m in gone:
                continue
            if m in verdict.waits_on:
                call.waits_on = verdict.waits_on[m]
            elif verdict.rank_outcomes.get(m) == "ok" and self.ranks[m].alive:
                # its messages all went through before the wait ran out (a broadcast's rank fed
                # by the root that times out on a sibling): done, not failed by the closure
                self._complete_alone(inst, call)

    def _complete_alone(self, inst: Instance, call: Call) -> None:
        """Complete `call`, whose own messages all went through, before the collective does:
        a broadcast's rank gets the root's tensor, a scatter's its block of the root's input
        (a leaf whose sibling left; tests/scripts/rooted_after_exit.py), another's value is
        not known."""
        src = inst.calls.get(call.root) if call.op in ("broadcast", "scatter") and call.root is not None else None
        if src is None:
            result = Payload.unknown(call.payload.numel, call.payload.dtype)
        elif call.op == "scatter":
            result = chunk_payload(src.payload, inst.members.index(call.rank), len(inst.members))
        else:
            result = dataclasses.replace(src.payload)
        self._complete_call(call, result)

    def _settle_exited(self, inst: Instance, gone: dict[int, float], missing: tuple[int, ...] = (),
                       failures_only: bool = False) -> bool:
        """Complete or fail what Gloo does of `inst` without its `gone` members and the live
        `missing` ones (`gloo_bridge.absent_outcomes`). Returns whether a call was settled.
        `failures_only`: the missing will still post it, so only a failure is final yet."""
        calls = [c for m, c in inst.calls.items() if m not in gone]
        verdict = gloo_bridge.absent_outcomes(calls, inst.members, gone, list(missing))
        outcomes, settled = verdict.rank_outcomes, False
        # whose closed or reset socket a peer_error met: a gone member, or one the messages abort
        lost = min(gone) if gone else min([*verdict.aborting_ranks, *(m for m in inst.calls if not self.ranks[m].alive)],
                                          default=inst.members[0])
        if failures_only:
            settled = self._abort(inst, verdict)  # whatever the missing post later, this message came
            for m, call in inst.calls.items():
                if not call.done and self.ranks[m].alive and outcomes.get(m) == "peer_error":
                    self._fail_call(call, lost)
                    settled = True
            return settled
        settled = self._abort(inst, verdict)
        # a poster that timed out sent what it could, then closed its pairs (or left): a call
        # left with a message pending with it fails now
        closed = self._closed.get(inst.group, set())
        left = {m for m in inst.calls if m not in gone and (not self.ranks[m].alive or m in closed)}
        for m, call in inst.calls.items():
            if not call.done and self.ranks[m].alive and verdict.waits_on.get(m, frozenset()) & left:
                self._fail_call(call, min(verdict.waits_on[m] & left))
                settled = True
                continue
            if call.done or not self.ranks[m].alive or outcomes.get(m) not in ("ok", "peer_error"):
                call.waits_on = verdict.waits_on.get(m)
                continue
            settled = True
            if outcomes[m] == "peer_error":
                self._fail_call(call, lost)
                continue
            self._complete_alone(inst, call)
        inst.stuck = inst.stuck or bool(gone)  # the calls left wait on stuck peers: their exits fail them
        if not missing:
            self._instances.pop((inst.group, inst.seq), None)  # nobody left to post it
        return settled

    def _abort(self, inst: Instance, verdict: gloo_rules.MismatchVerdict) -> bool:
        """The live posters a message longer than their receive kills (`verdict`), with the
        finding, once: a rank that aborted before is dead, and a replay of the messages
        finds it again. A poster whose messages all went through (outcome "ok": a broadcast's
        root that wrote to the aborting receiver, a sibling fed by the root) is not failed by
        the abort's reset: it completes with the others' outcomes. Returns whether any rank aborted."""
        aborting = [r for r in verdict.aborting_ranks if self.ranks[r].alive and not inst.calls[r].done]
        if aborting:
            posted = [inst.calls[m] for m in inst.members if m in inst.calls]
            self.findings.append(gloo_bridge.finding(inst.group, inst.seq, posted, verdict))
            inst.stuck = True  # the others wait on whom their messages name, as after `_match`
            for m, call in inst.calls.items():  # (`quiet_after_abort`: the abort's reset must not fail it)
                call.waits_on = frozenset() if quiet_after_abort(verdict, m) else verdict.waits_on.get(m, call.waits_on)
        for r in aborting:
            self.abort_rank(r, *gloo_rules.abort_words(verdict, r), inst.calls[r].entry)
        return bool(aborting)

    def settle_absent(self) -> bool:
        """Called when nothing more can happen: what Gloo completes without the absent. A
        collective that some live member will now never post is not all-or-nothing on Gloo
        (`_settle_exited`: a broadcast's rank fed by the root finishes even if a sibling never
        shows up). Returns whether any rank could go on."""
        progressed = False
        for opens in self._open.values():
            for inst in list(opens.values()):
                if inst.matched or inst.finished or not inst.calls:
                    continue
                missing = [m for m in inst.members if m not in inst.calls and self.ranks[m].alive]
                if missing:
                    progressed |= self._settle_exited(inst, self._gone_absent(inst.group, inst.calls), tuple(missing))
        return progressed


def _timed_out(call: Call) -> bool:
    """Whether `call` failed by Gloo's timeout (its own wait, or its rank's pair closure): it
    posted its messages before (those its peers had matched were exchanged), unlike a call
    that failed as it posted (`RankRaised.error`)."""
    return call.ok is False and getattr(getattr(call.value, "error", None), "category", None) == "timeout"
