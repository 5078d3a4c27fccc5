"""A rank's connection to the coordinator: requests, completions, and the idle watcher.

One client per rank process, made when the script calls `init_process_group`. A reader
thread receives completions (result bytes are copied into the op's output tensors there,
as a real backend's progress thread would) and ends the process at once when the
coordinator goes away, so no rank outlives the `simdist` process that simulates it.

The idle watcher makes waits that torch does in C++ visible. DDP's reducer waits on the
futures of its bucket all-reduces inside autograd, where no Python code runs; a rank whose
main thread holds requested, unfinished futures and has stopped using CPU (for
`IDLE_CONFIRM_S`) while standing in a C++ call reports itself blocked on them.

A rank is blocked only while none of its script's threads could still post (`rank.threads`):
every message that may leave the rank blocked carries its *claim* (`busy`: how many threads
could still post, and how many completions the reader had handled), and a changed claim is
sent while some thread waits (`report`). A thread waits in simdist from when it announces a
wait until the reader handles that op's completion, so a claim never counts a woken thread as
waiting; the coordinator takes a claim only once it has seen every completion it sent.

On real Gloo the reader thread also answers the launcher's request for the rank's record
when a run hangs (`answer_dumps`): the main thread is then blocked in a C++ wait, where a
Python signal handler would never run.
"""

from __future__ import annotations

import contextlib
import functools
import itertools
import os
import socket
import sys
import threading
import time
from collections.abc import Callable
from typing import Any, Protocol

from simdist.script import wire
from simdist.script.rank import callbacks, simclock, stack, threads

IDLE_POLL_S = 0.04
IDLE_CONFIRM_S = 0.12
IDLE_CPU_EPS_S = 0.0005
EXIT_COORDINATOR_GONE = 70
_THREAD_KEYS = itertools.count(1)
_THREAD = threading.local()


def thread_key() -> int:
    """This thread's key for its compute mark (`ranks.RankConn.cpu_marks`), unique for the
    process's life: `threading.get_ident()` is handed again to a thread started after another
    ended (CPython does so at once), and the coordinator then measured the new thread's CPU
    against the ended one's mark."""
    key = getattr(_THREAD, "key", None)
    if key is None:
        key = _THREAD.key = next(_THREAD_KEYS)
    return key
hard_exit = os._exit  # the real one: `exits` wraps os._exit to report the exit first


class Completable(Protocol):
    def complete(self, data: bytearray | None, error: str | None, source: int | None = None) -> None: ...

    def give_up(self, error: str) -> None: ...


class Client:
    def __init__(self, path: str):
        self.sock = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        self.sock.connect(path)
        self.rank: int | None = None
        self.semantics = "gloo"  # the backend the simulator models for this run (told at init)
        # which generation of ranks this process's default group belongs to (told at each init,
        # `simdist.script.generations`), and when each of its generations began (time.time_ns(),
        # the Flight Recorder's clock): a process that initialises again records both in one FR
        self.generation = 1
        self.generation_starts: list[tuple[int, int]] = []
        self._send_lock = threading.Lock()
        self._state = threading.Lock()
        self._ids = itertools.count(1)
        self._works: dict[int, Completable] = {}
        self._futures: set[int] = set()  # requested futures not yet complete
        self._replies: dict[int, tuple[threading.Event, list[dict[str, Any]]]] = {}
        self.main_waits = 0  # visible waits in progress on the main thread
        self.sleeping = 0  # time.sleep in progress on the main thread (busy, not blocked)
        self._waits: dict[int, frozenset[int]] = {}  # thread ident -> the ops it waits for in simdist
        self._timed: dict[int, int] = {}  # thread ident -> its key, for threads in a timed wait (`rank.timedwait`)
        self._handled = 0  # "done" and "waited" messages the reader has handled
        self._claim: list[int] | None = None  # the last claim sent: [threads that could post, handled]
        # torchrun's agent is about to end this rank (`simdist.script.agent`): from this instant
        # (time.time_ns()) no thread but the reader tells the coordinator anything (`_parked`)
        self.halted_ns: int | None = None
        self._reader: int | None = None  # the reader thread's ident

    # ------------------------------------------------------------------ sending
    def send(self, header: dict[str, Any], buffers: list[Any] | tuple = (), claim: bool = False,
             register: list[int] | frozenset[int] | None = None, ident: int | None = None,
             timed: bool = False) -> frozenset[int] | None:
        """`claim`: the message may leave the rank blocked, so it carries the rank's claim,
        taken under the send lock so that claims reach the coordinator in the order taken.
        `register`: the ops thread `ident` (this one) waits for from now on (`waiting`; the
        registration is returned for `wait_over`). Registered under the send lock, right
        before this message goes: a claim another thread sends counts this thread as unable
        to post only once the coordinator has the message that says what it waits for (and
        its `Work.wait(timeout=)`). Registered before, the main thread's claim could reach
        the coordinator between the registration and this message: every thread waiting, no
        timeout known, a hang proven while the thread's timed wait was still to come
        (tests/scripts/thread_wait_times_out.py, 1 run in ~15)."""
        registered = None
        self._parked()
        if "cpu" in header:  # its sender's `time.thread_time()`: the coordinator keeps a mark per thread
            header["tid"] = thread_key()
            header["p"] = simclock.now()  # and the script's clock then (`rank.simclock`; `OpRecord.proc`)
        try:
            with self._send_lock:
                if register is not None:
                    registered = self.waiting(register, ident)
                if timed:
                    with self._state:
                        self._timed[threading.get_ident()] = thread_key()
                if claim:
                    header["busy"] = self._claim = self.claim()
                wire.send(self.sock, header, buffers)
        except OSError:
            coordinator_gone()
        return registered

    def send_line(self, stream: str, line: str) -> None:
        """One line the rank printed on `stream` ("stdout", "stderr"), for the report (`rank.output`).
        A stdout line carries its thread's CPU time: the coordinator stamps it on the rank's clock
        after the compute that came before it (a line printed after a long computation comes
        after torchrun's SIGTERM when that computation outlasts the agent's instant)."""
        self.send({"t": "out", "s": stream, "x": line, **({"cpu": time.thread_time()} if stream == "stdout" else {})})

    # ------------------------------------------------------------------ threads that could post
    def waiting(self, ids: list[int] | frozenset[int], ident: int | None = None) -> frozenset[int] | None:
        """Thread `ident` (this one) waits in simdist for these ops (or a request's reply,
        `request`), those not completed yet; the registration (None: nothing left to wait
        for) is what `wait_over` ends."""
        with self._state:
            pending = frozenset(i for i in ids if i in self._works or i in self._replies)  # (one count for both)
            if not pending:
                return None
            self._waits[ident or threading.get_ident()] = pending
            return pending

    def wait_over(self, registered: frozenset[int] | None, ident: int | None = None) -> None:
        """Thread `ident` (this one) no longer waits as `registered` (if it still did)."""
        with self._state:
            ident = ident or threading.get_ident()
            if registered is not None and self._waits.get(ident) is registered:
                del self._waits[ident]

    def claim(self) -> list[Any]:
        """[how many of the script's threads could still post (`rank.threads`: not waiting in
        simdist, nor idle plumbing, nor in a timed wait; a callback queued or running counts),
        completions handled, the keys of the threads in a timed wait (`rank.timedwait`)]."""
        with self._state:
            waits, handled, timed = set(self._waits) | set(self._timed), self._handled, sorted(self._timed.values())
        in_job, queued = callbacks.RUNNERS.pending()
        n = sum(1 for _ in threads.running(lambda ident, _tid, _frame: ident in waits, own=in_job))
        return [n + int(queued), handled, timed]

    def timed_wait(self, seconds: float, number: int, sleep: bool = False) -> None:
        """This thread begins a wait that its timer ends after `seconds` (`rank.timedwait`: its
        `number` names it in the coordinator's wake; `sleep`: a `time.sleep`, which only its timer ends)."""
        self.send({"t": "twait", "s": seconds, "n": number, "cpu": time.thread_time(), **({"sl": 1} if sleep else {})},
                  claim=True, timed=True)

    def timed_woken(self, idents: list[int]) -> None:
        """Another thread notified these threads' waits (`rank.timedwait`): they run from now on."""
        with self._state:
            for ident in idents:
                self._timed.pop(ident, None)

    def timed_over(self, timer: bool) -> None:
        """This thread's timed wait ended (`timer`: its timer ended it): it could post from now on."""
        with self._state:
            self._timed.pop(threading.get_ident(), None)
        if timer:
            self.send({"t": "woke", "cpu": time.thread_time()})
        self.report()

    def _parked(self) -> None:
        """Once halted, a thread other than the reader that would tell the coordinator
        something (a printed line, a sleep, its process's end) waits here for the SIGTERM
        instead: what it did after the agent's decision is not what torchrun's worker did.
        (Before the send lock: the reader's answer must still go out.)"""
        if self.halted_ns is not None and threading.get_ident() != self._reader:
            threading.Event().wait()

    def report(self) -> None:
        """While some thread waits in simdist: tell the coordinator a claim that changed."""
        self._parked()
        with self._state:
            if not self._waits:
                return
        try:
            with self._send_lock:
                now = self.claim()
                if now != self._claim:
                    self._claim = now
                    wire.send(self.sock, {"t": "busy", "busy": now})
        except OSError:
            coordinator_gone()

    def request(self, header: dict[str, Any], blocks: bool = False) -> dict[str, Any]:
        """Send and block for the coordinator's reply (init, new_group, the store barrier).
        `blocks`: the coordinator counts this thread as blocked until it replies (a `Block`:
        new_group's and the store barrier's waits), so the request carries the rank's claim
        with this thread waiting in simdist until the reply comes (`waiting`, `_woke`): a
        claim taken before is stale once the rank handled a completion since (a collective
        before new_group: the hang was never proven, the group's timeout never ran out)."""
        rid = next(self._ids)
        ev, box = threading.Event(), []
        with self._state:
            self._replies[rid] = (ev, box)
        registered = self.send({**header, "req": rid}, claim=blocks, register=[rid] if blocks else None)
        ev.wait()
        self.wait_over(registered)
        return box[0]

    def began(self, generation: int) -> None:
        """Its default group now belongs to `generation` (the coordinator's answer to its init)."""
        self.generation = generation
        self.generation_starts.append((generation, time.time_ns()))

    def generation_at(self, t_ns: int) -> int:
        """The generation that was current when something was recorded at `t_ns`."""
        return next((g for g, t in reversed(self.generation_starts) if t <= t_ns), 1)

    def new_op(self, work: Completable, track: bool = True) -> int:
        """An id for a new op; `track`: its completion comes from the coordinator (else the
        rank completes it itself and the coordinator's answer is ignored)."""
        op_id = next(self._ids)
        if track:
            with self._state:
                self._works[op_id] = work
        return op_id

    def future_requested(self, op_id: int) -> None:
        with self._state:
            if op_id in self._works:
                self._futures.add(op_id)

    # ------------------------------------------------------------------ receiving
    def start(self) -> None:
        threading.Thread(target=self._read, name="simdist-reader", daemon=True).start()
        watch = self._watch_idle if _watcher is None else functools.partial(_watcher, self)
        threading.Thread(target=watch, name="simdist-idle", daemon=True).start()

    def _read(self) -> None:
        self._reader = threading.get_ident()
        while True:
            try:
                msg = wire.recv(self.sock)
            except OSError:
                msg = None
            if msg is None:
                coordinator_gone()
                return
            header, buffers = msg
            kind = header["t"]
            if kind == "done":
                with self._state:
                    work = self._works.pop(header["id"], None)
                    self._futures.discard(header["id"])
                    self._woke(header["id"])
                if work is not None:
                    try:
                        work.complete(buffers[0] if buffers else None, header.get("error"), header.get("src"))
                    except Exception as e:  # noqa: BLE001 - the reader must live on, the op must end
                        work.complete(None, f"simdist: could not deliver the result of this operation: {e}")
                self._handled_one()
            elif kind == "waited":  # a wait(timeout=) ran out; the op goes on
                with self._state:
                    work = self._works.get(header["id"])
                    self._woke(header["id"])
                if work is not None:
                    work.give_up(header["error"])
                self._handled_one()
            elif kind == "reply":
                with self._state:
                    ev, box = self._replies.pop(header["req"])
                    self._woke(header["req"])
                box.append(header)
                ev.set()
            elif kind == "abort":
                _abort(header.get("detail", ""))
            elif kind == "dump":  # answered here: the main thread may be blocked in a C++ wait for good
                if header.get("halt"):  # torchrun's agent's SIGTERM follows the answer (`simdist.script.agent`)
                    self.halted_ns = time.time_ns()
                self.send({"t": "record", **_record(self.halted_ns)})
            elif kind in _HANDLERS:  # another module's message (`on_message`)
                _HANDLERS[kind](header)

    def _woke(self, op_id: int) -> None:
        """Under `_state`, before the op's waiters can wake: they could post from now on."""
        for ident in [i for i, ids in self._waits.items() if op_id in ids]:
            del self._waits[ident]

    def _handled_one(self) -> None:
        """After a completion is delivered (its callbacks queued): claims count it from now."""
        with self._state:
            self._handled += 1
        self.report()

    # ------------------------------------------------------------------ idle watcher
    def _watch_idle(self) -> None:
        main = threading.main_thread()
        try:
            clock = time.pthread_getcpuclockid(main.ident or 0)
        except (AttributeError, OSError):
            return
        last = time.clock_gettime(clock)
        idle_since: float | None = None
        reported: frozenset[int] | None = None
        registered: frozenset[int] | None = None  # main's registration as waiting in simdist (`waiting`)
        while main.is_alive():
            time.sleep(IDLE_POLL_S)
            now, cpu = time.time(), time.clock_gettime(clock)
            with self._state:
                waiting = frozenset(self._futures)
            idle = (waiting and cpu - last < IDLE_CPU_EPS_S and not self.main_waits and not self.sleeping)
            last = cpu
            if not idle:
                self.wait_over(registered, main.ident)
            self.report()  # a thread that could post may have exited or begun to wait meanwhile
            if not idle:
                idle_since, reported = None, None
                continue
            idle_since = idle_since or now - IDLE_POLL_S
            if now - idle_since < IDLE_CONFIRM_S or waiting == reported:
                continue
            frame = sys._current_frames().get(main.ident or 0)
            if frame is None or not _in_native_call(frame):
                continue  # waiting on something else (a queue, a socket, input): busy for us
            self.wait_over(registered, main.ident)
            reported = waiting
            registered = self.send({"t": "idle", "ids": sorted(waiting), "since": idle_since,
                                    "frames": stack.capture(frame)}, claim=True, register=waiting, ident=main.ident)


def _in_native_call(frame: Any) -> bool:
    """Whether the main thread waits inside a C/C++ call made from torch or user code (a
    future wait in autograd), not in a Python-level wait of the standard library."""
    return stack.is_user_file(frame.f_code.co_filename) or "torch" in frame.f_code.co_filename


_answer: Callable[[], dict[str, Any]] | None = None  # what a "dump" request is answered with
_HANDLERS: dict[str, Callable[[dict[str, Any]], None]] = {}  # message kind -> its handler (`on_message`)
_watcher: Callable[[Client], None] | None = None  # what the idle thread runs instead of `_watch_idle`


def watch_with(fn: Callable[[Client], None]) -> None:
    """On real Gloo (`rank.stall`): no simulated futures to watch; the idle thread watches
    for a stall in a torch.distributed wait instead, for the early hang verdict."""
    global _watcher
    _watcher = fn


def on_message(kind: str, fn: Callable[[dict[str, Any]], None]) -> None:
    """The reader thread hands the coordinator's messages of `kind` to `fn` (which must not
    block: completions come through the reader). `rank.timedwait`'s "wake"."""
    _HANDLERS[kind] = fn


def answer_dumps(fn: Callable[[], dict[str, Any]]) -> None:
    """On real Gloo (`rank.patches`): when the launcher has decided that the run hangs, it asks
    each live rank for its record before killing it (`Coordinator.collect_records`); the
    reader thread answers with `fn()` (the Flight Recorder, where the main thread stands)."""
    global _answer
    _answer = fn


def _record(halted_ns: int | None = None) -> dict[str, Any]:
    """The answer to a "dump"; halted (`Client.halted_ns`): without the operations issued
    after that instant (the Flight Recorder's first dump in a process may take seconds,
    while the main thread runs on), which torchrun's worker never issued."""
    if _answer is None:
        return {}
    try:
        x = _answer()
    except Exception as e:  # noqa: BLE001 - the answer must still go out, or the launcher waits for nothing
        return {"warnings": [f"{type(e).__name__}: {e}"]}
    if halted_ns is not None:
        if isinstance(x.get("fr"), dict):
            x["fr"] = {**x["fr"], "entries": [e for e in x["fr"].get("entries", []) if e.get("t", 0) <= halted_ns]}
        if isinstance(x.get("p2p"), list):
            x["p2p"] = [o for o in x["p2p"] if o.get("t", 0) <= halted_ns]
    return x


def coordinator_gone() -> None:
    """The simdist process is gone: nothing can complete any more, so end at once."""
    hard_exit(EXIT_COORDINATOR_GONE)


def _abort(detail: str) -> None:
    """Gloo's I/O thread threw (a mismatch the backend cannot pair): std::terminate, SIGABRT.
    Its words go straight to fd 2, as C++'s terminate handler writes them, not through
    `sys.stderr`: torch's excepthook swaps `sys.stderr` for a StringIO while it formats a
    traceback (`distributed_c10d._distributed_excepthook`), and what this thread wrote there
    meanwhile died with the process (about 1 run in 8 of tests/test_script_abort_words.py)."""
    text = f"terminate called after throwing an instance of 'gloo::EnforceNotMet'\n  what():  {detail}\n"
    data = text.encode(errors="replace")
    with contextlib.suppress(OSError):
        while data:
            data = data[os.write(2, data):]
    if CLIENT is not None and CLIENT.rank is not None:  # the report's stderr, as `rank.output` tees it
        for line in text.splitlines():
            CLIENT.send_line("stderr", line)
    os.abort()


CLIENT: Client | None = None


def connect(path: str) -> Client:
    global CLIENT
    if CLIENT is None:
        CLIENT = Client(path)
        CLIENT.start()
    return CLIENT


def forget_after_fork() -> None:
    """In a forked child (a DataLoader worker): the parent's connection is not ours to use."""
    global CLIENT
    CLIENT = None
