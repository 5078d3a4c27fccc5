"""On real Gloo: is this rank stalled in a torch.distributed wait? (the early hang verdict)

A hung real run used to be ended only by the watchdog (`--timeout`, 300 s by default). The
launcher can decide sooner, but only on evidence the ranks give, so that a rank that is
computing, sleeping, or waiting on anything but Gloo is never taken for a hung one. Every
`POLL_S` this rank's watcher thread observes (`observe`), and calls the rank *stalled* when
all of these hold:

* its main thread is asleep in the kernel in a futex wait (`/proc/self/task/<tid>/syscall`):
  how ProcessGroupGloo's `Work::wait` and the `Future` waits of DDP's reducer block (a
  condition variable). `time.sleep` is a nanosleep (and counted by `client.sleeping`), a
  socket, pipe or DataLoader-worker read a read/poll: none is a futex;
* that wait is torch's: the main thread's innermost Python frame is in torch's package (a
  blocking collective, `barrier`, `recv`, `loss.backward()` with DDP's reducer waiting in
  C++) or in the `Work.wait`/`Future.wait` wrappers below (the user's own `work.wait()`);
* or, instead of those two, the main thread waits at the c10d store for its peers
  (`store_wait`): it stands in torch's `init_process_group` (the store rendezvous, rank 0's
  TCPStore server waiting for its clients, Gloo's full-mesh connect), in the creation of a
  group (`_new_process_group_helper`: `new_group`'s connect) or in `_store_based_barrier`,
  in a syscall (a TCPStore wait is a poll or a recv, a connect retry or a server's poll for
  clients a sleep; none of them returns before a peer writes its key or the wait's timeout
  ends it), using at most the other threads' share of CPU (a server's poll every 10 ms), and
  not in one long sleep from one look to the next (`_one_long_sleep`: a client's back-off
  between connects to a server not up yet wakes by itself). That wait is its pending
  operation, and its `timeout` (torch's default where the script gives none) the deadline
  that may end it;
* every other Python thread the script runs is in such a wait too, or is the standard
  library's plumbing that only another thread of the process can wake (`_others_waiting`):
  one that sleeps or waits with a timeout uses no CPU, yet may post the operation the ranks
  wait for when it wakes; a script with such a thread alive (a `threading.Timer`, tqdm's
  monitor, a TensorBoard writer) is left to the watchdog;
* the rank has an unfinished Gloo operation (or waits at the store): its Flight Recorder's
  per-group counters (`pg_status`: last enqueued > last completed; Gloo's FR records no
  start, only completion), or, with a thread in a `Work.wait`/`Future.wait`, its unfinished
  entries (a later async op may complete before an earlier one: `_groups`), or a p2p operation `rank.pylog` noted whose work has not completed;
* since the last poll its main thread used no CPU (in a store wait: at most the others'
  share) and its other threads (Gloo's I/O and worker threads, the script's own; not this
  watcher) at most `OTHERS_CPU_SHARE` of a core: bytes arriving for a Gloo operation, or a
  thread of the script computing, use CPU;
* its operation counters (enqueued and completed per group, p2p issued and done) are the
  ones seen when the stall began: nothing completed meanwhile.

Any change ends the stall; the next one starts a new period. The watcher tells the
coordinator when a stall begins (`since`, and `limit`: the shortest Gloo timeout of a group
with an unfinished operation, or of a `Work.wait(timeout=)` in progress on any thread, or of
the store wait: the time after which torch itself would end the wait; `in`: a store wait's call
and line, for the report; `grp`: in a group's creation, the group's name and members, for the
status lines: `_group_of`) and when it ends. The coordinator's rule
(`simdist.script.stalls`) calls the run hung once every live rank has been stalled for
`--hang-after` seconds.
"""

from __future__ import annotations

import os
import pickle
import sys
import threading
import time
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist

from simdist.script.rank import client, pylog, stack, threads
from simdist.script.rank.threads import FUTEX_NR, SLEEP_NRS, syscall, voluntary_switches
from simdist.script.stores import BARRIER_CALL, BARRIER_KEY, DEFAULT_TIMEOUT_S

POLL_S = 0.1
MAIN_CPU_EPS_S = 0.0005  # the main thread's CPU per poll that still counts as none
OTHERS_CPU_SHARE = 0.05  # the other threads' CPU per poll, as a share of one core, that counts as idle
_TORCH_DIR = os.path.join(os.path.dirname(os.path.abspath(torch.__file__)), "")
_HERE = os.path.abspath(__file__)
_C10D = os.path.abspath(dist.distributed_c10d.__file__)
_PYLOG = os.path.abspath(pylog.__file__)  # its wrappers of the group's collectives call the backend
# torch's functions (in `_C10D`) inside which a rank waits at the c10d store for its peers, each
# with the `timeout` that ends that wait: init's rendezvous and full-mesh connect, a group's
# connect (`new_group`, `new_subgroups`, a device mesh's groups), TORCH_DIST_INIT_BARRIER's barrier
_STORE_WAITS = frozenset({"init_process_group", "_new_process_group_helper", "_store_based_barrier"})
_WRAPPERS = frozenset({"wrapper", "_new_process_group_helper", "helper"})  # torch's loggers, the layer's patch

# per thread (ident): its Work.wait/Future.wait calls in progress, inner last, each with the
# timeout that ends it (None: none); the main thread's mark its wait as torch's, and every
# thread's bound the stall (a side thread's `work.wait(timeout=)` ends with an error, after
# which the thread may post what the ranks wait for)
_wait_limits: dict[int, list[float | None]] = {}
_main_tid: list[int] = []  # the kernel's id of the main thread (`threading` keeps a stale one after a fork)


def _note_main_tid() -> None:
    """On the main thread (at install, and in a forked child, whose forking thread becomes
    its main thread): `threading.main_thread().native_id` is the parent's after `os.fork`;
    the parent's other threads' waits are not the child's."""
    if threading.current_thread() is threading.main_thread():
        _main_tid[:] = [threading.get_native_id()]
    for ident in [i for i in _wait_limits if i != threading.get_ident()]:
        del _wait_limits[ident]  # a forked child has no other thread: a parent's timed wait bounds nothing here


def _wrap_wait(cls: Any, method: str = "wait", own_timeout: Any = None) -> None:
    """The user's own `work.wait()` / `fut.wait()` calls C++ directly (no torch frame on the
    stack): the wrapper marks the wait as torch's and keeps its timeout. Also on
    `monitored_barrier`, whose own timeout ends group rank 0's waits in C++ (the others wait
    for rank 0's answer with the group's timeout: `own_timeout(self)` says which)."""
    orig = getattr(cls, method)
    own = own_timeout or (lambda _self: True)

    def wait(self: Any, *args: Any, **kwargs: Any) -> Any:
        t = kwargs.get("timeout", args[0] if args else None)
        timed = hasattr(t, "total_seconds") and t.total_seconds() > 0 and own(self)
        mine = _wait_limits.setdefault(threading.get_ident(), [])
        mine.append(t.total_seconds() if timed else None)
        try:
            return orig(self, *args, **kwargs)
        finally:
            mine.pop()

    setattr(cls, method, wait)


def install() -> None:
    """Installed on real Gloo only (`rank.patches`): the wait wrappers, and the watcher that
    the client's idle thread runs instead of the simulated backend's idle watcher."""
    _wrap_wait(dist.distributed_c10d.Work)
    _wrap_wait(torch._C.Future)
    _wrap_wait(dist.ProcessGroup, "monitored_barrier", lambda pg: pg.rank() == 0)
    _note_main_tid()
    os.register_at_fork(after_in_child=_note_main_tid)
    client.watch_with(watch)


@dataclass
class Observation:
    """One look at the rank (see the module's docstring)."""

    waiting: bool  # main thread (and every other thread of the script) in a futex wait in torch's code, or at the store
    key: tuple  # operation counters: per group (name, enqueued, completed), p2p (issued, done)
    pending: bool  # an operation not completed
    limit_s: float | None  # the shortest Gloo timeout that could end the pending waits
    main_cpu: float
    others_cpu: float
    store: StoreWait | None = None  # the main thread's wait at the c10d store, if it is in one
    store_sleep: bool = False  # ... caught in a sleep (a server's 10 ms poll, or a connect retry's back-off)
    switches: int | None = None  # the main thread's voluntary context switches, in a store wait


def _in_torch_wait(frame: Any) -> bool:
    if frame is None:
        return False
    filename = os.path.abspath(frame.f_code.co_filename)
    return filename.startswith(_TORCH_DIR) or filename == _HERE


def _in_torch_futex(_ident: int, tid: int, frame: Any) -> bool:
    """Real Gloo's wait in the backend: asleep in a futex wait in torch's code."""
    return syscall(tid) == FUTEX_NR and _in_torch_wait(frame)


@dataclass(frozen=True)
class StoreWait:
    """The main thread waits at the c10d store for its peers: in `what` (the torch.distributed
    call the script made), called at `where` (the user's [file, line]), until `limit_s`."""

    what: str
    where: tuple[str, int] | None
    limit_s: float
    group: tuple[str, tuple[int, ...]] | None = None  # a group's creation: torch's name of the group, its members


def store_wait(frame: Any) -> StoreWait | None:
    """Whether the stack from `frame` (innermost) stands in one of torch's store waits
    (`_STORE_WAITS`), and which: the innermost such frame's `timeout` (the one the waiting
    call got; None until init fills in torch's default: that default), and the call the
    user's code made (the outermost function of torch or of this layer below the user's
    innermost frame that is not a wrapper)."""
    found, inner = None, []
    while frame is not None and not stack.is_user_file(frame.f_code.co_filename):
        code = frame.f_code
        if found is None and code.co_name in _STORE_WAITS and os.path.abspath(code.co_filename) == _C10D:
            found = frame
        inner.append(frame)
        frame = frame.f_back
    if found is None:
        return None
    try:
        timeout = found.f_locals.get("timeout")  # a parameter of each (another thread's frame: read only)
    except Exception:  # noqa: BLE001 - unreadable: the wait may end at any time, so it bounds the stall
        return StoreWait(found.f_code.co_name, None, 0.0)
    limit = timeout.total_seconds() if hasattr(timeout, "total_seconds") else DEFAULT_TIMEOUT_S["gloo"]
    what = BARRIER_CALL if found.f_code.co_name == "_store_based_barrier" else \
        next((f.f_code.co_name for f in reversed(inner) if f.f_code.co_name not in _WRAPPERS), found.f_code.co_name)
    where = None if frame is None else (frame.f_code.co_filename, frame.f_lineno)
    return StoreWait(what, where, float(limit), _group_of(found))


def _group_of(found: Any) -> tuple[str, tuple[int, ...]] | None:
    """The group a store wait in `_new_process_group_helper` creates (its parameters `group_name`
    and `global_ranks_in_group`; none for the default group, made at init: no members given),
    or the world a store-based barrier counts (`_store_based_barrier`'s `rendezvous_count`, when
    it is the world's size: a group made with use_local_synchronization counts its own members,
    which the barrier is not given), under the barrier's key. A torch whose functions lack these
    parameters names no group: its waits get no status line (one name for all would merge the
    groups' lines), the hang verdict does not read it."""
    code = found.f_code.co_name
    if code == "_store_based_barrier":
        try:
            name, count = found.f_locals.get("group_name"), found.f_locals.get("rendezvous_count")
            whole = name is not None and count is not None and int(count) == dist.get_world_size()
            return (f"{BARRIER_KEY}:{name}", tuple(range(int(count)))) if whole else None
        except Exception:  # noqa: BLE001 - another thread's frame, read only: unreadable, the wait stays unnamed
            return None
    if code != "_new_process_group_helper":
        return None
    try:
        name, members = found.f_locals.get("group_name"), found.f_locals.get("global_ranks_in_group")
        return (str(name), tuple(int(r) for r in members)) if name is not None and members else None
    except Exception:  # noqa: BLE001 - another thread's frame, read only: unreadable, the wait stays unnamed
        return None


def _others_waiting(main_ident: int | None) -> bool:
    """Every other Python thread of the script is itself asleep in a futex wait in torch's
    code, or is the standard library's idle plumbing (`rank.threads`, the one definition the
    simulator uses too): a thread that runs, sleeps, or waits on anything else (an async
    checkpoint's or a heartbeat's thread, a `threading.Timer`, tqdm's monitor) may yet post
    the operation the ranks wait for, with no CPU used meanwhile: the rank is then not stalled."""
    return next(threads.running(_in_torch_futex, skip=() if main_ident is None else (main_ident,)), None) is None


def _groups(c: client.Client, in_wait: bool = False) -> tuple[list[tuple[str, int, int]], set[str]]:
    """Per group: (id, last enqueued, last completed) from the Flight Recorder's counters
    (no entries: microseconds), and torch's names of the groups of this generation with an
    unfinished collective. "Last completed" is the latest op that completed, not a count:
    Gloo runs async ops on several worker threads, so a later op may complete while an
    earlier one never does (measured: async all_reduces of other sizes issued in the other
    order on one rank of 4, tests/scripts/async_mismatch_hang.py, left a rank with counters
    2/2 blocked in the first one's `wait`). So with a thread `in_wait` on a work or a future
    the unfinished entries are read even when the counters are level. The counters are keyed
    by the backend's process-wide id, not by
    torch's group name: the two part once a rank is left out of a group (no backend is made
    for it) or the process initialises again (names restart, ids go on), and the counters
    of an earlier generation's groups stay, never to finish. So the unfinished collectives'
    own entries (no stacks: cheap) name their groups, those of this generation only. Gloo's
    entries never read completed (no end event: `onlyActive` keeps them all, measured in torch
    2.13), so an entry counts as unfinished until it is `retired` (what moves the counters):
    else every group used so far in the generation would read pending, and the shortest of
    their timeouts would bound the stall (a finished group's 20 s timeout held an async
    mismatch hang on the default group back to the watchdog)."""
    dump = torch._C._distributed_c10d._dump_fr_trace
    status = pickle.loads(dump(includeCollectives=False)).get("pg_status") or {}
    rows = sorted((str(g), int(s.get("last_enqueued_collective", -1)), int(s.get("last_completed_collective", -1)))
                  for g, s in status.items())
    if not in_wait and not any(enq > done for _g, enq, done in rows):
        return rows, set()
    active = pickle.loads(dump(includeCollectives=True, includeStackTraces=False, onlyActive=True)).get("entries") or []
    return rows, {str((e.get("process_group") or (e.get("pg_id"),))[0]) for e in active
                  if not e.get("is_p2p") and not e.get("retired")
                  and c.generation_at(int(e.get("time_created_ns") or 0)) == c.generation}


def _timeout_of(names: set[str]) -> float | None:
    """The shortest Gloo timeout among these groups (torch names them in `pg_names`); a group
    whose timeout cannot be read counts as 0 s: one that may end the wait at any time."""
    by_name = {str(name): pg for pg, name in list(dist.distributed_c10d._world.pg_names.items())}
    limits = []
    for name in names:
        try:
            limits.append(by_name[name]._get_backend(torch.device("cpu")).options._timeout.total_seconds())
        except (KeyError, AttributeError, RuntimeError):
            limits.append(0.0)
    return min(limits, default=None)


def wrapper_wait(frame: Any) -> float | None:
    """Under TORCH_DISTRIBUTED_DEBUG=DETAIL a collective first runs its ProcessGroupWrapper's
    checks inside the issuing call (`rank.pgwrapper`): a monitored barrier on a helper group,
    which the Flight Recorder does not record, so no counter shows it pending. The main thread
    in c10d's collective on a group whose backend is a wrapper waits there: the group's timeout
    (the helper's) may end it; None when it is not there."""
    while frame is not None and os.path.abspath(frame.f_code.co_filename) == _PYLOG:
        frame = frame.f_back
    if frame is None or os.path.abspath(frame.f_code.co_filename) != _C10D:
        return None
    local = frame.f_locals
    try:
        backend = (local.get("group") or local.get("pg"))._get_backend(torch.device("cpu"))
        if not isinstance(backend, torch._C._distributed_c10d._ProcessGroupWrapper):
            return None
        return float(backend.options._timeout.total_seconds())
    except (AttributeError, RuntimeError, TypeError):
        return None


def observe(main: threading.Thread, tid: int, c: client.Client) -> Observation:
    cpu_clock = time.pthread_getcpuclockid(main.ident or 0)
    main_cpu = time.clock_gettime(cpu_clock)
    others_cpu = time.process_time() - time.thread_time()  # every thread's but this watcher's
    frame = sys._current_frames().get(main.ident or 0)
    store = store_wait(frame)
    nr = syscall(tid)
    # a store wait may poll (rank 0's server waiting for clients: a sleep of 10 ms, then a look):
    # caught between two sleeps it runs, with next to no CPU (`_still`)
    checks = wrapper_wait(frame) if nr == FUTEX_NR else None
    asleep = (nr == FUTEX_NR and (bool(_wait_limits.get(main.ident or 0)) or _in_torch_wait(frame)
                                  or checks is not None)) or (store is not None and nr is not None)
    waiting = FUTEX_NR is not None and not c.sleeping and asleep and _others_waiting(main.ident)
    timed = [x for waits in list(_wait_limits.values()) for x in list(waits)]
    rows, pending_groups = _groups(c, bool(timed)) if dist.is_initialized() else ([], set())
    issued, done, p2p_groups = pylog.progress(c.generation)
    limits = [x for x in (_timeout_of(pending_groups | p2p_groups), *timed, store and store.limit_s, checks)
              if x is not None]
    return Observation(waiting, (tuple(rows), issued, done, store),
                       bool(pending_groups or p2p_groups or store or checks is not None),
                       min(limits, default=None), main_cpu, others_cpu, store, store is not None and nr in SLEEP_NRS,
                       voluntary_switches(tid) if store is not None else None)


def _still(before: Observation, now: Observation, dt: float) -> bool:
    """Nothing moved between two looks taken `dt` apart. A main thread in a store wait may use
    as much CPU as the other threads may: torch's own polling (rank 0's TCPStore waiting for its
    clients looks every 10 ms: ~1% of a core measured), no code of the script's can run there."""
    main_eps = OTHERS_CPU_SHARE * dt if now.store is not None else MAIN_CPU_EPS_S
    return (now.key == before.key and now.main_cpu - before.main_cpu <= main_eps
            and now.others_cpu - before.others_cpu <= OTHERS_CPU_SHARE * dt and not _one_long_sleep(before, now))


def _one_long_sleep(before: Observation, now: Observation) -> bool:
    """The main thread slept through the whole time between two looks in a store wait: one
    long timed sleep, not a poll loop (whose short sleeps switch ~10 times a look). That is a
    TCPStore client's back-off between connects to a server not there yet (0.5 s, growing by
    1.5x to 60 s): it wakes by itself and connects once rank 0's server is up, so it is no
    stall (as `time.sleep` is none), though rank 0 is stalled waiting for it meanwhile."""
    return now.store_sleep and (now.switches is None or now.switches == before.switches)


def watch(c: client.Client) -> None:
    """The watcher thread's loop: tell the coordinator when a stall begins and ends."""
    main = threading.main_thread()
    tid = _main_tid[0] if _main_tid else main.native_id or 0
    if FUTEX_NR is None or syscall(tid) is None:
        return  # no way to see the main thread's wait here: only the watchdog decides
    last: Observation | None = None
    last_at = time.monotonic()
    since: float | None = None
    while main.is_alive():
        time.sleep(POLL_S)
        try:
            now: Observation | None = observe(main, tid, c)
        except Exception:  # noqa: BLE001 - a rank that cannot be observed is never called stalled
            now = None
        at = time.monotonic()
        stalled = (now is not None and last is not None and now.waiting and now.pending
                   and _still(last, now, at - last_at))
        if stalled and since is None:
            since = time.time() - (at - last_at)  # still since the previous look
            store = now.store  # type: ignore[union-attr]
            where = None if store is None else (
                store.what + ("" if store.where is None else f" at {os.path.basename(store.where[0])}:{store.where[1]}"))
            c.send({"t": "stall", "since": since, "limit": now.limit_s, "in": where,  # type: ignore[union-attr]
                    "grp": None if store is None or store.group is None else [store.group[0], list(store.group[1])]})
        elif not stalled and since is not None:
            since = None
            c.send({"t": "stall", "since": None})
        last, last_at = now, at
