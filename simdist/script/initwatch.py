"""A simulated first init left waiting for ranks that do not come: what the user sees while it
waits, and when the simulator may call it a hang before torch's default timeout.

A script that starts its own ranks (`mp.spawn`) with one of them missing from init waits on
real Gloo until torch's default timeout (30 min for Gloo), then raises the store's errors
(`simdist.script.rendezvous`); the simulator cannot prove the missing rank gone as it does for
a torchrun-style rank (which process would have been it is unknown), so it waited as long,
silently. Two things instead:

* a status line (`status`, to the caller's callback: the CLI prints it on stderr) once the
  waits have lasted `STATUS_AFTER_S`, and again as what it says changes or every
  `STATUS_EVERY_S`: which ranks wait at which line, which never came, how a process of the
  run that never called init ended (an mp.spawn child tells the coordinator as it exits,
  `rank.exits`), which processes of the run still live, what real torch raises and when,
  and that Ctrl-C ends the run with a report;
* an early hang verdict, by the rule the real side's stall verdict uses (`simdist.script.stalls.
  StallRule`, one rule: every live rank stalled, for `--hang-after` seconds, and no timeout
  of the script's that would end the waits before the watchdog): every live rank waits in a
  first init without a timeout, and every other live process of the run (the script's own,
  that started the ranks; multiprocessing's resource tracker) sleeps in a wait that no timer
  ends (`untimed_wait`: mp.spawn's join polls its children's sentinels without a timeout, the
  tracker reads its pipe): no process of the run can become the missing rank until one of
  these returns, and none can. A process still running or
  sleeping with a timer (`time.sleep`: a late rank) is not such a wait: no verdict then.

A group's members waiting in `new_group` for one that has not come (it computes or sleeps
first, or never calls it while its process runs) get the same status lines, on both sides
(`_groups_gather`); the words of both are `simdist.script.gathering`'s.
"""

from __future__ import annotations

import os
import platform
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from simdist.procs import processes_with_env
from simdist.script import env
from simdist.script.gathering import Gathering, raises_words, timeouts_words
from simdist.script.ranks import user_line
from simdist.script.rendezvous import INIT_WAIT, fate, left_words
from simdist.script.stalls import EARLY, Ending, StallRule

_NO_TIMER = "wait with no timer (the script's own in mp.spawn's join, multiprocessing's helpers)"
STATUS_AFTER_S = 5.0  # the first status line: after this long without a rank arriving
STATUS_EVERY_S = 30.0  # then again this often (or as soon as what it says changes)
LOOK_EVERY_S = 0.5  # how often the run's processes are looked at (a /proc scan)

# syscalls that wait for another process or file descriptor, and how a wait without a timer
# shows in /proc/PID/task/TID/syscall: (the field holding the argument: 1 + its index, "null": a null timeout pointer,
# "neg": a negative timeout (a C int), "any": a read, which has none (multiprocessing's resource tracker reads its pipe), "block": no WNOHANG in the options)
_UNTIMED = {
    "x86_64": {0: (0, "any"), 7: (3, "neg"), 23: (5, "null"), 270: (5, "null"), 271: (3, "null"), 232: (4, "neg"),
               281: (4, "neg"), 61: (3, "block"), 247: (4, "block"), 202: (4, "null")},
    "aarch64": {63: (0, "any"), 73: (3, "null"), 72: (5, "null"), 22: (4, "neg"), 260: (3, "block"), 95: (4, "block"),
                98: (4, "null")},
}.get(platform.machine(), {})


def untimed_wait(pid: int) -> bool:
    """Every thread of process `pid` is asleep in a wait that no timer ends (poll or select
    without a timeout, waitpid without WNOHANG, a futex without a timeout): only another
    process (a child's exit) can end it. False where /proc cannot tell."""
    try:
        tids = os.listdir(f"/proc/{pid}/task")
    except OSError:
        return False
    for tid in tids:
        try:
            with open(f"/proc/{pid}/task/{tid}/syscall", encoding="ascii") as f:
                fields = f.read().split()
            nr = int(fields[0])
            arg, rule = _UNTIMED[nr]
            value = int(fields[arg], 16) if arg else 0
        except (OSError, ValueError, KeyError, IndexError):
            return False  # running ("running" is no number), another syscall, or no /proc
        if not {"any": True, "null": value == 0, "neg": value & 1 << 31 != 0, "block": value & 1 == 0}[rule]:  # (an int's -1: 0xffffffff)
            return False
    return bool(tids)


def tree(roots: set[int]) -> list[int]:
    """The live processes (not zombies) descended from `roots`, the roots included: a fork
    server's children carry no run tag in /proc/PID/environ (their environment is set after
    the fork), so the run's processes are also found by their parents."""
    parent, alive = {}, set()
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            with open(f"/proc/{name}/stat", "rb") as fh:
                fields = fh.read().rsplit(b")", 1)[1].split()
        except (OSError, IndexError):
            continue
        parent[int(name)] = int(fields[1])
        if fields[0] not in (b"Z", b"X"):
            alive.add(int(name))
    found, todo = set(), [p for p in roots if p in alive]
    while todo:
        p = todo.pop()
        found.add(p)
        todo.extend(c for c, pp in parent.items() if pp == p and c in alive and c not in found)
    return sorted(found)


def _wait_of(c: Any) -> tuple[str, str, float] | None:
    """A live rank's wait in its first init, as (words, file:line, since when), the same on
    both sides: the simulator's rendezvous (`RankConn.init_wait`) or, on real Gloo, the store
    wait the rank's stall names (`RankConn.store_wait`); None: it does not wait there (yet)."""
    if c.init_wait is not None:
        return (INIT_WAIT, _at(c.init_wait.frames), c.init_wait.since) if c.init_wait.at is not None else None
    store = c.store_wait()
    return None if store is None else (*store, c.stall_since)


def _say(w: InitWatch, subject: str, text: str, waited: float, now: float) -> None:
    """A status line on `subject` ("init", "new_group"), if it says something new or the last
    one is `STATUS_EVERY_S` old."""
    if w.status is None or (text == w._said[0] and now - w._said[1] < STATUS_EVERY_S):
        return
    w._said = (text, now)
    w.status(f"{subject}: waiting {waited:.0f} s: {text}; Ctrl-C ends the run with a report")


def _at(frames: list[Any]) -> str:
    """A wait's user line, as `file:line` (its innermost frame of the user's code)."""
    return user_line(frames) or "?"


@dataclass
class InitWatch:
    """What the coordinator needs to watch a run's first init: the run's tag (its processes
    carry it, `launch.tagged_processes`), the processes the launcher started, the rule (None:
    status lines only, no early verdict) and where status lines go."""

    run_id: str
    launched: Callable[[], list[int]]
    rule: StallRule | None = None
    status: Callable[[str], None] | None = None
    _looked: float = 0.0
    _quiet_since: float | None = None  # since when every process of the run was accounted for
    _others: list[int] = field(default_factory=list)  # in a wait with no timer (`untimed_wait`)
    _running: list[int] = field(default_factory=list)  # any other process of the run (a late rank)
    _said: tuple[str, float] = ("", 0.0)


class InitWatchMixin:
    """The coordinator's side. Needs `gens`, `_live()`, `spawn_left`, `no_init`,
    `_default_timeout_s()`; `init_watch` is set by the launcher (`simdist.script.api`)."""

    init_watch: InitWatch | None = None
    gens: list[Any]
    spawn_left: list[dict[str, Any]]

    def _init_waiting(self) -> list[Any]:
        """The live ranks, if every one waits in a first init of a generation that lacks ranks
        (`_wait_of`)."""
        live = self._live()  # type: ignore[attr-defined]
        if not live or any(_wait_of(c) is None or c.gen.complete() for c in live):
            return []
        return live

    def _init_stalled(self) -> Ending | None:
        """Called at each turn of the serving loop: a status line when due, and the hang, once
        the rule holds (see the module's docstring)."""
        w = self.init_watch
        now = time.time()
        live = self._init_waiting() if w is not None and not all(g.complete() for g in self.gens) else []
        if w is None or not live:
            if w is not None and w.rule is not None:  # (the real side's `_none_to_come` keeps its own)
                w._quiet_since = None
            return None
        since = [_wait_of(c)[2] for c in live]  # type: ignore[index]
        untimed = all(c.init_wait is None or c.init_wait.limit_s is None for c in live)  # (real: `_none_to_come`'s)
        if now - max(since) < min(STATUS_AFTER_S, w.rule.hang_after_s if w.rule else STATUS_AFTER_S):
            return None
        self._look(w, {c.pid for c in live}, untimed, now)  # (due or not: the real side's `_none_to_come` looks too)
        if now - max(since) >= STATUS_AFTER_S:
            self._say_status(w, live, now - min(since), now)
        if w.rule is not None and w._quiet_since is not None and now - w._quiet_since >= w.rule.hang_after_s:
            return Ending("hang", now, w._quiet_since, early=self._init_note(w, live, now))
        return None

    def _look(self, w: InitWatch, ranks: set[int | None], untimed: bool, now: float) -> bool:
        """Look at the run's processes other than the ranks' (`ranks`: their pids), at most every
        `LOOK_EVERY_S`: which wait with no timer, which run (`InitWatch._others`, `_running`),
        and since when none could still become a missing rank (`_quiet_since`: every one in a
        wait no timer ends, every rank's pid known, and `untimed`: no rank's own wait has a
        timeout). Whether it looked."""
        if now - w._looked < LOOK_EVERY_S:
            return False
        w._looked = now
        run = set(processes_with_env(env.RUN_ID, w.run_id)) | set(tree(set(w.launched())))
        others = sorted(p for p in run if p not in ranks)
        w._others = [p for p in others if untimed_wait(p)]  # the script's own in mp.spawn's join, multiprocessing's helpers
        w._running = [p for p in others if p not in w._others]
        quiet = None not in ranks and not w._running and untimed
        w._quiet_since = (w._quiet_since or now) if quiet else None
        return True

    def _none_to_come(self, ranks: list[Any], now: float) -> float | None:
        """Real Gloo, a generation that lacks ranks: since when no other process of the run
        could still become one (the rule of `_init_stalled`, over the processes of `ranks`,
        the live ranks: their store waits' timeouts are the stall rule's to judge); None:
        one may still come, or no watch."""
        w = self.init_watch
        if w is None:
            return None
        self._look(w, {c.pid for c in ranks}, True, now)
        return w._quiet_since

    def _none_to_come_note(self) -> str:
        """The early verdict's note for `_none_to_come`: which ranks never came, why none can."""
        w = self.init_watch
        assert w is not None
        gen = self.gens[-1]
        missing = [r for r in range(gen.world_size) if r not in gen.by_rank]
        return (f"; rank(s) {missing} never called init_process_group{self._left()}, and no other process of the "
                f"run could bring them: " + (f"process(es) {w._others} {_NO_TIMER}" if w._others else "none is alive"))

    def _waits(self, live: list[Any]) -> str:
        gen = live[0].gen
        missing = [r for r in range(gen.world_size) if r not in gen.by_rank]
        return Gathering({c.rank: _wait_of(c) for c in live}, f"a world of {gen.world_size}",  # type: ignore[misc]
                         missing).words()

    def _left(self) -> str:
        """How the processes of the run that left before init ended (mp.spawn's children)."""
        return "".join(f"; {left_words(x)}" for x in self.spawn_left)

    def _real_torch(self, live: list[Any]) -> str:
        """What real torch raises, and when, for the waits without a timeout (`rendezvous.fate`)."""
        if not self.rendezvous:  # type: ignore[attr-defined]  # real Gloo: the ranks' own store waits say when
            return timeouts_words(c.stall_limit for c in live)
        default_s = self._default_timeout_s()  # type: ignore[attr-defined]
        fates = [(c.rank, fate(c.gen, c.rank, default_s)) for c in live]
        return raises_words([(r, f.error) for r, f in fates if f is not None], default_s)

    def _say_status(self, w: InitWatch, live: list[Any], waited: float, now: float) -> None:
        others = (f"; process(es) {w._others} of the run {_NO_TIMER}" if w._others else "") + (
            f"; process(es) {w._running} of the run still run or sleep: they may yet call init" if w._running else "")
        _say(w, "init", f"{self._waits(live)}{self._left()}{others}; {self._real_torch(live)}", waited, now)

    def _groups_gather(self) -> None:
        """Called at each turn of the serving loop: a status line once members of a group have
        waited in its creation for `STATUS_AFTER_S` with none coming meanwhile (a member that
        computes or sleeps before its `new_group`, or never calls it while its process runs),
        or in the store-based barrier that ends it (TORCH_DIST_INIT_BARRIER=1), and again as
        what it says changes or every `STATUS_EVERY_S`: who waits for whom, in the words
        init's lines use (`gathering`), on both sides (`GroupsMixin.gatherings`,
        `StoreBarrierMixin.barrier_gatherings`)."""
        w, now = self.init_watch, time.time()
        if w is None or w.status is None:
            return
        found = self.gatherings() + self.barrier_gatherings()  # type: ignore[attr-defined]
        due = [g for g in found if now - g.since()[1] >= STATUS_AFTER_S]
        if due:
            _say(w, "new_group", "; ".join(f"{g.words()}; {g.torch}" for g in due),
                 now - min(g.since()[0] for g in due), now)

    def _init_note(self, w: InitWatch, live: list[Any], now: float) -> str:
        assert w.rule is not None and w._quiet_since is not None
        return (f"{EARLY} (--hang-after {w.rule.hang_after_s:g} s): hang ({self._real_torch(live)}): for "
                f"{now - w._quiet_since:.1f} s {self._waits(live)}{self._left()}, and no other process of the run "
                f"could bring them: " + (f"process(es) {w._others} {_NO_TIMER}" if w._others else "none is alive"))
