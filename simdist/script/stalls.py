"""The early hang verdict of a real Gloo run: every live rank stalled for `--hang-after` seconds.

A simulated run's hang is a proof (every live rank blocked in operations the engine knows
cannot complete, `Coordinator._hung`). Real Gloo ranks tell the coordinator nothing of their
operations while they run, so a hung real run used to last until the watchdog (`--timeout`,
300 s by default): five minutes for every `simdist real`/`compare` of a script that hangs.

Each real rank watches itself (`simdist.script.rank.stall`) and says when it becomes
*stalled* -- its main thread asleep in a futex wait in torch's code (a blocking collective,
`Work.wait`, DDP's reducer waiting in C++), an unfinished Gloo operation, none of its
threads using CPU, none of its operation counters moving -- and when that ends. The run is
called hung when every rank that has not exited has been stalled, without a break, for
`hang_after_s` seconds since the last of those stalls began and since the last rank's
process ended (on Gloo a peer learns of an exit only when the process is gone, and that
fails its waits). In that time no operation completed on any rank and no rank computed:
nothing is left that could post the operations they wait for. Not decided early:

* a rank computing, sleeping, reading a file or a DataLoader worker, or waiting on anything
  but torch (it is not stalled), or a rank that announced its exit and is leaving;
* a rank with another Python thread of the script's alive that is not itself in a torch wait
  (nor the standard library's plumbing asleep until another thread wakes it, as a
  DataLoader's queue feeder): it may post the awaited operation when it wakes (a heartbeat,
  an async checkpoint, a `threading.Timer`; also tqdm's monitor or a TensorBoard writer,
  which never do, but look the same);
* waits that Gloo's own timeout may end before the watchdog fires (a group timeout or a
  `Work.wait(timeout=)` on any thread, shorter than `--timeout`): Gloo ends them with an error, as the
  simulator models (`simdist.script.deadlines`), so the run is left to run its course;
* a world with a rank that has not called init while its process may still come (it sleeps,
  computes or imports before its init): a torchrun-style rank whose launched process ended
  without an init is known never to come, and does not hold the verdict; nor, for a script
  that starts its own ranks (`mp.spawn`), does a missing rank once every other process of
  the run waits with no timer (`initwatch`: no process is left that could become it);
* a rank blocked somewhere no rank can see (a host without /proc): the watchdog still ends those.

A rank waiting at the c10d store for its peers is stalled as one in a collective is
(`rank.stall.store_wait`): in `init_process_group` (the store rendezvous, Gloo's full-mesh
connect) for a rank that never comes, in `new_group` for a member that never calls it (or
failed its init), in the store-based barrier. The store wait's `timeout` (init's, the group's;
torch's default of 30 min where the script gives none) is its deadline, as a group's timeout is
a collective's: shorter than the watchdog, the run is left to run its course. The note names
each such rank's call and line.

The report says which rule ended the run (`Ending.early`, a note): this one, with what was
observed, or the watchdog's.
"""

from __future__ import annotations

import math
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from simdist.errors import InputError
from simdist.script.ranks import RankConn

HANG_AFTER_S = 3.0  # default settle period: long enough for a Gloo peer to see an exit, short for users
# How the notes of a report begin that say which rule ended a hung real run (`compare` shows them)
EARLY, WATCHDOG = "hang found early", "watchdog:"


def check_hang_after(seconds: float | None, what: str = "--hang-after") -> float | None:
    """The settle period as given (None or 0: no early verdict, the watchdog alone); a
    negative or non-finite number is bad input naming `what`."""
    if seconds is None:
        return None
    if isinstance(seconds, bool) or not isinstance(seconds, (int, float)) or not math.isfinite(seconds) \
            or seconds < 0:
        raise InputError(f"{what}: must be a number of seconds, 0 or more (0: the watchdog alone), got {seconds!r}")
    return float(seconds) or None


@dataclass
class Ending:
    """Why a script run's serving loop stopped: finished, hang, timeout or interrupted (Ctrl-C)."""

    kind: str
    at: float  # wall time
    last_blocked: float | None = None  # hang: when the last rank became blocked
    early: str | None = None  # a hang a stall rule found (this one, `simdist.script.initwatch`'s): what was seen


@dataclass(frozen=True)
class StallRule:
    """`hang_after_s`: the settle period; `watchdog_s`: the run's `--timeout`, the outer bound."""

    hang_after_s: float
    watchdog_s: float

    def hung_since(self, ranks: Sequence[RankConn], now: float) -> float | None:
        """When the hang began (the last stall began or the last rank's process ended), if every
        live rank of `ranks` (each of the world's that called init; the caller vouches that any
        other will never come) has been stalled for the settle period since; None otherwise."""
        live = [c for c in ranks if c.connected]
        if not live or any(c.exit is not None or c.stall_since is None for c in live):
            return None
        if any(c.stall_limit is not None and c.stall_limit < self.watchdog_s for c in live):
            return None  # Gloo's timeout may end a wait first: let it
        since = max([c.stall_since for c in live if c.stall_since is not None]
                    + [c.ended_at for c in ranks if c.ended_at is not None])
        return since if now - since >= self.hang_after_s else None

    def note(self, since: float, at: float, ranks: Sequence[RankConn]) -> str:
        """What was observed, for the report: the verdict came from this rule, not the watchdog."""
        live = sorted(c.rank for c in ranks if c.connected and c.rank is not None)
        limits = [c.stall_limit for c in ranks if c.connected and c.stall_limit is not None]
        store = sorted((c.rank, c.stall_in) for c in ranks if c.connected and c.rank is not None and c.stall_in)
        kind = "Gloo and store" if store else "Gloo"
        gloo = f"their {kind} timeouts ({min(limits):g} s and up)" if limits else kind
        at_store = ("; at the c10d store, waiting for peers that never come: "
                    + "; ".join(f"rank {r} in {w}" for r, w in store)) if store else ""
        return (f"{EARLY} (--hang-after {self.hang_after_s:g} s, not the {self.watchdog_s:g} s watchdog): "
                f"for {at - since:.1f} s every live rank ({', '.join(map(str, live))}) had its main thread (and any "
                "other thread of the script) asleep in a torch.distributed wait (a futex wait in torch's code, or a "
                "wait at the c10d store in init_process_group or a group's creation) with an unfinished operation, "
                "its threads used next to no CPU (Gloo's idle wake-ups) and no operation "
                f"completed on any rank{at_store}; {gloo} would not end these waits before the watchdog")


class StalledMixin:
    """The coordinator's early hang verdict on real Gloo, from the ranks' stall reports."""

    stalls: StallRule | None
    gens: list[Any]
    conns: list[RankConn]

    def _stalled(self) -> Ending | None:
        """Real Gloo: the hang the stall rule finds (`simdist.script.stalls`), once the latest
        generation has all its ranks, or lacks only ranks whose launched process ended before
        its init (torchrun-style, `_unjoinable`), or no other process of the run could still
        become one (mp.spawn: `InitWatchMixin._none_to_come`; a rank still to come, sleeping or
        computing before its init, keeps the run from a verdict). Judged over every rank process still
        connected, also one that destroyed its group and lives on (it may be computing: then
        it is not stalled), with the end of every other one (`StallRule.hung_since`)."""
        if self.stalls is None or not self.gens:
            return None
        # the ended ones too: a process's end (and a membership's, `_next_membership`) starts the
        # settle period again, as its peers' waits fail only once its process is gone
        ranks = [c for c in self.conns if c.rank is not None]
        now = time.time()
        waits = self._starting() and not self._unjoinable(self.gens[-1])  # for ranks that may still come
        live = [c for c in ranks if c.connected]  # (the run's processes are looked at once all of them stall)
        come = self._none_to_come(live, now) if waits and all(c.stall_since is not None for c in live) else None
        since = self.stalls.hung_since(ranks, now)
        if since is None or (waits and (come is None or now - max(since, come) < self.stalls.hang_after_s)):
            return None
        since = max(since, come) if come is not None else since
        return Ending("hang", now, since, early=self.stalls.note(since, now, ranks)
                      + (self._none_to_come_note() if waits else ""))
