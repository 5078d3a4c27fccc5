"""The coordinator's view of each rank process, its operations and its simulated clock.

Simulated time per rank is the rank's measured compute (CPU time of the thread that
issues, between its messages; each stretch is kept as a compute span for the timeline) plus
modelled communication, on the cost model of the chosen topology: a collective completes at the
latest issue time among its members plus the cost model's duration, a p2p transfer at the
later of its two sides plus the link time. A rank's clock catches up with an operation's
completion when the rank waited for it (visibly, or through a future torch waits on in C++);
the catch-up is applied at the rank's next message, which the rank can only send after the
wait, so the clock does not depend on the order in which ranks' messages arrive. With
`measure_compute=False` compute counts as zero and every time in the report is a pure
function of the program.
"""

from __future__ import annotations

import socket
from collections import defaultdict, deque
from dataclasses import dataclass, field
from typing import Any

from simdist.engine.calls import P2PKey
from simdist.frames import Frame, resolve_frames
from simdist.report import Span, TraceEntry
from simdist.script.wire import Decoder


def raw_frames(raw: list[Any]) -> tuple[list[Frame], list[bool]]:
    """The rank side's call-site frames (`rank.stack`: file, line, function, the user's?) as
    resolved frames and which are the user's."""
    return resolve_frames([{"filename": f[0], "line": f[1], "name": f[2]} for f in raw]), [bool(f[3]) for f in raw]


def first_user(raw: list[Any]) -> list[Any] | None:
    """[file, line, function] of the innermost user frame of raw frames (`rank.stack`)."""
    return next((list(f[:3]) for f in raw if f[3]), None)


def file_line(where: list[Any]) -> str:
    """`file:line` of a frame ([path, line, ...]): how the reports' notes name a user's line."""
    return f"{str(where[0]).rsplit('/', 1)[-1]}:{where[1]}"


def user_line(raw: list[Any]) -> str | None:
    """`file:line` of the innermost user frame of raw frames; None when there is none."""
    f = first_user(raw)
    return None if f is None else file_line(f)


def waiting_in(call: str) -> str:
    """How a rank that waits in a torch.distributed call for peers that have not come is
    reported, by either side: the simulator's rendezvous and groups (`rendezvous.INIT_WAIT`,
    `groups.NEW_GROUP_WAIT`) and a real rank's store wait (`RankConn.store_wait`)."""
    return f"waiting in {call}"


def exit_words(x: dict[str, Any]) -> str:
    """How a rank's process ended, in words, from what it told the coordinator (`rank.exits`:
    `how`, `code`, `error`): the one wording of the report's `exit`, of a rank that left
    before its init (`rendezvous`) as of one that left its group."""
    how, code = x.get("how"), x.get("code")
    if how == "exception" or x.get("error"):
        return f"raised {x['error']['type']}"
    if how == "destroyed":  # it initialised again after this: its generation ended here
        return "destroyed its process group"
    if how in (None, "returned"):
        return "returned normally"
    return f"{how}({code if code is not None else ''})"


@dataclass
class OpRecord:
    """One operation a rank issued."""

    rank: int
    id: int
    entry: TraceEntry
    frames: list[Frame]
    user: list[bool]
    want_data: bool
    members: list[int]
    done: bool = False
    waited: bool = False
    call: Any = None  # the engine's Call (for Gloo's timeout: `Engine.time_out`)
    deadline: float | None = None  # simulated time at which Gloo's timeout ends its wait (`deadlines`)
    limit_s: float | None = None  # the timeout that deadline comes from
    ended_at: float | None = None  # simulated time at which its timeout ended it
    # its deadline is torch's default timeout or longer: it fires once simulated time gets there (a rank's
    # clock past it, `_overdue`; threads' timed waits woken up to it, `TimedWakesMixin`), never as the way
    # out of a run stuck without them, which is reported as the hang it is, at once (`_expire_next`)
    long: bool = False
    proc: float | None = None  # the script's clock (`rank.simclock`) at its message, with `entry.t_issue`


@dataclass
class Block:
    """What a rank is blocked on: a visible wait (one op) or an idle future wait (several)."""

    ids: list[int]
    since: float  # wall time at which it blocked
    frames: list[Any]  # raw frames of the blocked thread
    label: str | None = None  # a wait in no operation (no ids): how the report names it (`groups`, `rendezvous`)


@dataclass
class Claim:
    """What a rank process last said of its threads (`rank.client`): how many of the script's
    threads could still post (`rank.threads`), once it had handled `handled` of its completions;
    and how many completions the coordinator has sent it. A claim taken before the rank saw
    every completion sent may count a thread that has woken since as waiting: it holds no more."""

    running: int = 0
    handled: int = 0
    sent: int = 0
    at: float = 0.0  # wall time it came
    timed: tuple[int, ...] = ()  # the keys of its threads in a timed wait (`rank.timedwait`): none runs

    def told(self, busy: list[Any], at: float) -> None:
        self.running, self.handled, self.at = int(busy[0]), int(busy[1]), at
        self.timed = tuple(busy[2]) if len(busy) > 2 else ()

    def quiet(self, timed: bool = False) -> bool:
        """No thread of the rank can post: every one waits in simdist or is idle plumbing (or,
        `timed`, asleep in a timed wait)."""
        return self.running == 0 and self.handled == self.sent and (timed or not self.timed)


@dataclass
class RankConn:
    """One connection from a process of the script (a rank once it calls init)."""

    sock: socket.socket
    decoder: Decoder = field(default_factory=Decoder)
    rank: int | None = None
    pid: int | None = None
    connected: bool = True
    ops: dict[int, OpRecord] = field(default_factory=dict)
    block: Block | None = None
    # a wait in a request that only its reply ends (new_group's, the store barrier's): while it stands
    # another thread's operation may replace `block` and end, and the rank waits here again (`unblock`)
    request_wait: Block | None = None
    clock: float = 0.0
    # per thread of its process (`rank.client.thread_key`): the CPU time that thread had at its last
    # message. Each message carries its sending thread's `time.thread_time()`, so one mark for all
    # threads took a side thread's post as the mark and then counted the main thread's whole CPU
    # since its start (imports included) as compute at its next message
    cpu_marks: dict[int | None, float] = field(default_factory=dict)
    wakes: dict[int | None, float] = field(default_factory=dict)  # per thread key: the end of its timed wait
    timers_at: dict[int | None, float] = field(default_factory=dict)  # per thread key: its last timer's end
    wait_numbers: dict[int | None, int] = field(default_factory=dict)  # per thread key: its timed wait's number
    wait_ends: dict[int | None, float] = field(default_factory=dict)  # ... and its end on the script's clock (`rank.simclock`)
    sleepers: set[int | None] = field(default_factory=set)  # thread keys whose timed wait is a `time.sleep`
    to_sync: list[OpRecord] = field(default_factory=list)
    stdout: list[str] = field(default_factory=list)
    stderr: list[str] = field(default_factory=list)
    exit: dict[str, Any] | None = None
    spawn: int | None = None  # its process is this child of `torch.multiprocessing.spawn` (told at init)
    record: dict[str, Any] | None = None  # real Gloo, a hung run: what it answered before it was killed
    terminated: str | None = None  # torchrun's agent ended it, in words (`simdist.script.agent`)
    stdout_at: list[float] = field(default_factory=list)  # simulated: the clock at each stdout line
    sleeps: list[tuple[float, list[Any]]] = field(default_factory=list)  # simulated: (clock, raw frames) of each sleep
    child_wait_from: float | None = None  # simulated: the clock where its main thread's child wait began
    abort_sent: bool = False
    batches: int = 0  # batches its DataLoaders yielded, all loaders and epochs (rank.batches)
    batches_at: list[tuple[float, int]] = field(default_factory=list)  # simulated: (clock, `batches` then)
    longest_epoch: int = 0  # the most batches one DataLoader iteration yielded
    capped: int = 0  # DataLoader iterations that a --batches cap ended early
    compute: list[Span] = field(default_factory=list)  # its measured compute on its simulated clock
    exit_at: float | None = None  # wall time of its exit announcement
    ended_at: float | None = None  # wall time its connection closed
    wait_until: tuple[OpRecord, float] | None = None  # a Work.wait(timeout=) in progress: its op, its end
    stall_since: float | None = None  # real Gloo: wall time its current stall began (`rank.stall`), else None
    stall_limit: float | None = None  # real Gloo: the shortest Gloo timeout that could end that stall's waits
    stall_in: str | None = None  # real Gloo: a stall at the c10d store: the call and line it waits in (`rank.stall`)
    stall_group: list[Any] | None = None  # ... in a group's creation: [torch's name of the group, its members]
    # a connection is one process; a RankConn is its membership in one generation of ranks
    # (`simdist.script.generations`): a process that initialises again gets a new one
    gen: Any = None  # the Generation it belongs to
    destroyed: bool = False  # its default group was destroyed: it left its generation, the process lives on
    destroy_frames: list[Any] = field(default_factory=list)  # raw frames of that destroy_process_group call
    claim: Claim = field(default_factory=Claim)  # of its process, whichever membership (`Claim`)
    init_wait: Any = None  # waiting in init_process_group for the world (`simdist.script.rendezvous.InitWait`)

    def active(self) -> bool:
        """A member of its generation still: its process is there and has not destroyed the group."""
        return self.connected and not self.destroyed

    def blocked(self) -> bool:
        """Blocked in operations none of which has completed, with no thread that could still
        post (one sleeping, computing or in a `threading.Timer` may post what its peers wait for)."""
        if self.init_wait is not None:  # its process has no group yet: nothing of it can post
            return True
        return (self.block is not None and all(not self.ops[i].done for i in self.block.ids if i in self.ops)
                and self.claim.quiet())

    def timed_wait(self, h: dict[str, Any], measure: bool) -> None:
        """A thread of it begins a timed wait ("twait": it wakes `s` on from its clock, or from
        its last timer's end if later; a main thread's told "sleep": at the rank's clock, which
        `sleep` moved to its end) or its timer ended one ("woke": the thread is at that wait's
        end; `rank.timedwait`). The rank's clock is left as it is: a side thread's wait
        does not delay the main thread (as its `time.sleep` does not), and `--zero-compute`
        times stay deterministic however often a thread's timer ended in wall time."""
        self.advance(h, measure)
        tid = h.get("tid")
        if h["t"] == "woke":
            self.timers_at[tid] = self.wakes.pop(tid, self.clock)
        elif h["t"] == "sleep":  # a main thread's told sleep: `sleep` moved the rank's clock to its end already
            self.wakes[tid] = self.clock
        else:
            self.wakes[tid] = max(self.clock, self.timers_at.get(tid, 0.0)) + max(float(h["s"]), 0.0)
        if h["t"] != "woke":
            self.wait_numbers[tid] = int(h.get("n") or 0)
            (self.sleepers.add if h["t"] == "sleep" or h.get("sl") else self.sleepers.discard)(tid)
            if h.get("p") is not None:
                self.wait_ends[tid] = float(h["p"]) + max(float(h["s"]), 0.0)

    def wake_at(self) -> float | None:
        """Blocked but for threads in a timed wait: when the first of them wakes, on its simulated
        clock (none of them can post before); None: not so. No wait in an op is needed: a rank
        whose main thread sleeps (or joins a thread in one) is as stuck until a timer ends."""
        if (self.init_wait is not None or not self.claim.timed
                or not self.claim.quiet(timed=True)
                or (self.block is not None and any(self.ops[i].done for i in self.block.ids if i in self.ops))):
            return None
        wakes = [self.wakes.get(k) for k in self.claim.timed]
        return None if None in wakes else min(w for w in wakes if w is not None)

    def wait_in_request(self, block: Block) -> None:
        """A thread of it waits in a request until the coordinator replies (`groups`, `rendezvous`)."""
        self.block = self.request_wait = block

    def answered(self) -> None:
        """The request's reply went out: its thread goes on. Another thread's op wait is let go
        too: the rank's claim still counts the woken thread as waiting (a reply is no completion
        its claims count), so the rank must not look blocked until its next claim."""
        self.block = self.request_wait = None

    def unblock(self) -> None:
        """Its op wait ended, or a thread posted: what still holds it is a wait in a request, if one
        stands (one Block per rank: a side thread's collective must not end the main thread's new_group)."""
        self.block = self.request_wait

    def store_wait(self) -> tuple[str, str] | None:
        """Real Gloo: the wait at the c10d store this rank is stalled in (`stall_in`, "new_group
        at x.py:32"), in the simulated side's words and its line: ("waiting in new_group",
        "x.py:32"); None: not stalled at the store."""
        if self.stall_since is None or not self.stall_in:
            return None
        call, _, at = self.stall_in.partition(" at ")
        return waiting_in(call), at or "?"

    def advance(self, h: dict[str, Any] | None, measure: bool) -> None:
        """At a message `h` (None: none, the connection closed): catch up with completed waits,
        then add the compute its sending thread (`tid`) did since that thread's last message (a
        thread's first message only sets its mark, as the process's first, init's, does).
        An operation a thread posts after a timed wait its timer ended (`timed_wait`: a side
        thread's `time.sleep`, `Event.wait(t)`) is posted at that wait's end at the earliest:
        the rank's one clock moves on to it, as its peers see the post on real Gloo (a thread
        that sleeps 2 s, then joins an all_reduce, makes its rank 2 s late for it; before, it
        posted at the rank's clock, and a peer's 1 s timeout never ran out). The end is on the
        simulated clock (from the rank's clock when the wait began), so `--zero-compute` stays
        deterministic. Other messages (a side thread's store call, a printed line) leave the
        clock: a heartbeat thread that sleeps and writes to the store must not make its rank's
        collectives late."""
        for rec in [r for r in self.to_sync if r.done]:
            end = rec.entry.t_done if rec.entry.t_done is not None else rec.ended_at
            if end is not None:
                self.clock = max(self.clock, end)
            self.to_sync.remove(rec)
        if h is not None and h.get("t") == "op":  # a thread posts at its own time: not before its timer's end
            self.clock = max(self.clock, self.timers_at.get(h.get("tid"), self.clock))
        cpu = None if h is None else h.get("cpu")
        if cpu is not None:
            tid = h.get("tid")  # type: ignore[union-attr]
            mark = self.cpu_marks.get(tid)
            if measure and mark is not None and cpu > mark:
                self.compute.append(Span(self.clock, self.clock + cpu - mark))
                self.clock += cpu - mark
            self.cpu_marks[tid] = cpu

    def batches_after(self, t: float) -> int:
        """Of its batches, how many its DataLoaders yielded after clock `t` (a rank that
        torchrun's agent ended at `t` never got them)."""
        return self.batches - max((n for at, n in self.batches_at if at <= t), default=0)

    def sleep(self, seconds: float) -> None:
        """`time.sleep` on its main thread: simulated time passes as it does for the script
        (a sleeping rank is late for its peers as a computing one is), in either compute mode."""
        if seconds > 0:
            self.compute.append(Span(self.clock, self.clock + seconds))
            self.clock += seconds

    def child_wait(self, h: dict[str, Any], measure: bool) -> None:
        """Its main thread's wait for a child process (`rank.childwait`): told as it begins
        ("b": the clock now is its start), then at its end with its length `s` (measured: left
        out under `--zero-compute`). It ends `s` after its start, not after the clock at its
        end: a side thread's post meanwhile may have moved the clock on already
        (`advance`), and adding `s` to that counted the overlap twice (a side thread sleeping
        2 s while the main thread waited 3 s for a child made the rank 5 s late, not 3)."""
        if h.get("b"):
            self.child_wait_from = self.clock
            return
        start, self.child_wait_from = self.child_wait_from, None
        end = (self.clock if start is None else start) + max(float(h["s"]), 0.0)
        if measure and end > self.clock:
            self.compute.append(Span(self.clock, end))
            self.clock = end

    def waited_on(self, rec: OpRecord) -> None:
        """The rank waits for `rec` now. A p2p's group timeout starts here (its deadline is
        unset until then): Gloo's `waitRecv`/`waitSend` time the wait, not the op, so an
        `irecv` waited for late gets the whole timeout and one never waited for never times
        out (measured, torch 2.13)."""
        if rec.deadline is None and rec.limit_s is not None and not rec.done:
            rec.deadline = self.clock + rec.limit_s
        if not rec.waited:
            rec.waited = True
            self.to_sync.append(rec)

    def last_op(self) -> OpRecord | None:
        return max(self.ops.values(), key=lambda r: r.id) if self.ops else None


class Timeline:
    """Issue and completion times of operations, from the ranks' clocks and the cost model."""

    def __init__(self, cost: Any):
        self.cost = cost
        self._collectives: dict[tuple[str, int], list[TraceEntry]] = defaultdict(list)
        self._sends: dict[P2PKey, deque[TraceEntry]] = defaultdict(deque)  # as the engine pairs them
        self._recvs: dict[P2PKey, deque[TraceEntry]] = defaultdict(deque)
        self._any: dict[tuple[str, int, int], deque[TraceEntry]] = defaultdict(deque)  # recvs from any source
        self._p2p_start: dict[int, float] = {}  # id(entry) -> start of its transfer

    def issued(self, rank: int, entry: TraceEntry, tag: int) -> None:
        """Called right after the engine issued `entry` (so a recv from any source already
        names the source the engine paired it with, if any)."""
        if entry.op in ("send", "recv"):
            peer = entry.peer
            g = entry.group
            if peer is None:  # a recv from any source with no message yet: the next send takes it
                self._any[(g, rank, tag)].append(entry)
                return
            key = (g, rank, peer, tag) if entry.op == "send" else (g, peer, rank, tag)
            mine, theirs = (self._sends, self._recvs) if entry.op == "send" else (self._recvs, self._sends)
            if not theirs[key] and entry.op == "send" and self._any[(g, peer, tag)]:
                theirs[key].append(self._any[(g, peer, tag)].popleft())
            if theirs[key]:
                other = theirs[key].popleft()
                start = max(other.t_issue, entry.t_issue)
                self._p2p_start[id(other)] = self._p2p_start[id(entry)] = start
            else:
                mine[key].append(entry)
        else:
            self._collectives[(entry.group, entry.seq)].append(entry)

    def completion(self, entry: TraceEntry, members: list[int], nbytes: int) -> float:
        if entry.op in ("send", "recv"):
            start = self._p2p_start.get(id(entry), entry.t_issue)
            src, dst = (members[0], members[1]) if len(members) == 2 else (0, 0)
            return start + self.cost.p2p_time(nbytes, src, dst)
        posted = self._collectives.get((entry.group, entry.seq), [entry])
        start = max(e.t_issue for e in posted)
        return start + self.cost.collective_time(entry.op, nbytes, members)


class ZeroCost:
    """The engine's own clock is not used for scripts (see Timeline): every step takes 0 s."""

    def collective_time(self, op: str, nbytes: int, ranks: list[int], algo: str | None = None) -> float:
        return 0.0

    def p2p_time(self, nbytes: int, src: int, dst: int) -> float:
        return 0.0


def per_process(members: list[RankConn], value: Any) -> int:
    """A count the rank side keeps per process (`rank.batches`), summed over processes: a
    process that initialised again reports its running total to its latest membership."""
    best: dict[int, int] = {}
    for m in members:
        best[id(m.sock)] = max(best.get(id(m.sock), 0), int(value(m)))
    return sum(best.values())
