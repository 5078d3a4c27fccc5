"""A thread of the script in a timed wait (`rank.timedwait`): a progress bar's monitor does not
keep Gloo's timeout from ending waits that can no longer complete.

tests/scripts/progress_bar_timeout.py: rank 0 waits in an all_reduce on WORLD the others never
join, each other rank in a recv from rank 0 on a group of all ranks, while a thread of each rank
loops on `Event.wait(INTERVAL)` as tqdm's monitor does (`Event.wait(10)`); each rank prints its
wait's error and how long it lasted by its clocks. On real Gloo every wait ends with Gloo's
timeout error after the timeout. The simulator used to count the waiting thread as one that
could post, so no rank was ever blocked, the deadlines never fired, and the run ended at the
watchdog ("sim hang, real error"). Now a thread in a timed wait posts nothing before its timer
ends: a deadline due before that fires at once, and once nothing else can happen the
coordinator wakes the thread itself (`simdist.script.timedwakes`), in simulated time, with the
script's clocks moved on (`rank.simclock`): torch's default 30-min timeout is reached in seconds."""

from __future__ import annotations

import subprocess

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script, run_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT, descendants, line_of

pytestmark = pytest.mark.real

BAR = ROOT / "tests" / "scripts" / "progress_bar_timeout.py"


def _ended_by_the_timeout(rep) -> None:
    """progress_bar_timeout.py's ending: rank 0 raised its timeout error again, the others returned."""
    assert [r.status for r in rep.ranks] == ["error"] + ["completed"] * (len(rep.ranks) - 1), (rep.source, rep.notes)
    assert rep.ranks[0].error.category == "timeout", (rep.source, rep.notes)


def _timed_out(rep, limit_s: int, woke: bool) -> None:
    """Every rank printed its wait's timeout error after `limit_s` by its three clocks."""
    message = f"Timed out waiting {limit_s * 1000}ms for recv operation to complete"
    for r in rep.ranks:
        assert r.output[1:] == [f"{r.rank} raised after [{limit_s}, {limit_s}, {limit_s}] s: {message}",
                                f"{r.rank} monitor woke as its timer says: True and read the time pass: {woke}"], \
            (rep.source, r.output)


@pytest.mark.parametrize(("interval", "nproc"), [("60", 2), ("0.3", 2), ("60", 3)])
def test_a_thread_in_a_timed_wait_leaves_gloos_timeout_to_end_the_waits(script_zygote, interval, nproc):
    """INTERVAL 60: the thread's timer ends long after Gloo's 2 s timeout, which fires on the
    simulated side as soon as every rank blocks (not after the thread's 60 s, nor at the
    watchdog). INTERVAL 0.3: the thread wakes six times before the deadline, posting nothing.
    (Was tests/scripts/timed_wait_thread.py, whose ranks wait on WORLD both: on a loaded host
    real Gloo's rank 1 met rank 0's pair closure, "Connection closed by peer", in 1 case of 9 on
    main's b74f561 and 6 of 18 here under load 9-13: a few ms of the wall clock between the
    ranks' entries, which the simulated clocks do not see.)"""
    run_id = new_run_id()
    both = compare_script(BAR, [interval, "2"], nproc_per_node=nproc, backend="gloo", timeout_s=120,
                          hang_after_s=3.0, run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    sim, real = both.sim.report, both.real.report
    for rep in (sim, real):
        _ended_by_the_timeout(rep)
        _timed_out(rep, 2, interval != "60")
        assert rep.ranks[0].location.line == line_of(BAR, "dist.all_reduce(t) if rank == 0"), rep.source
    assert sim.ranks[0].error.message == "Timed out waiting 2000ms for recv operation to complete", sim.notes
    assert sim.timings["wall_s"] < 30, sim.timings  # neither the thread's 60 s timer nor the watchdog
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)


NOTIFY_PROBE = r"""
import threading
from simdist.script.rank import client, timedwait

class Recorder:  # the client's timed-wait bookkeeping, with the woken thread held at its own telling
    def __init__(self):
        self.timed, self.told, self.gate = set(), threading.Lock(), threading.Lock()
        self.told.acquire()
        self.gate.acquire()
    def timed_wait(self, s, number):
        self.timed.add(threading.get_ident())
        self.told.release()
    def timed_woken(self, idents):
        self.timed.difference_update(idents)
    def timed_over(self, timer):
        self.gate.acquire()  # the woken thread gets here only once the notifier has looked
        self.timed.discard(threading.get_ident())

rec = client.CLIENT = Recorder()
timedwait.install()
ev = threading.Event()
t = threading.Thread(target=ev.wait, args=(30,), name="monitor")
t.start()
rec.told.acquire()
ev.set()
print("after-notify", sorted(rec.timed))
rec.gate.release()
t.join(5)
"""


def test_notify_takes_the_woken_thread_out_of_the_timed_waits_at_once():
    """A thread that another notifies runs from the notify on: were it still told asleep until
    its timer when the notifier then blocks in a collective (its claim taken before the woken
    thread tells its own wake), a deadline due before that timer could fire ahead of the post
    the woken thread is about to make. The notifier takes it out, on its own thread."""
    import sys

    out = subprocess.run([sys.executable, "-c", NOTIFY_PROBE], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "after-notify []" in out.stdout, out.stdout


# The coordinator wakes threads in timed waits itself once nothing else can happen (`simdist.script.timedwakes`)
SHORT_S = 3  # the real side's timeout: a run of real Gloo the test can wait for


def _said(report) -> list[list[str]]:
    return [r.output for r in report.ranks]


@pytest.fixture(scope="module")
def short_run(script_zygote):
    """progress_bar_timeout.py with a monitor waking every 0.5 s and a 3 s timeout, on both
    sides: on real Gloo both ranks' waits end with the timeout error at 3 s while the monitor
    keeps waking."""
    run_id = new_run_id()
    both = compare_script(BAR, ["0.5", str(SHORT_S)], nproc_per_node=2, backend="gloo", timeout_s=120,
                          hang_after_s=3.0, run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    return both


def test_a_monitor_waking_through_the_timeout_agrees_with_real_gloo(short_run):
    """Same outcome, error, ranks and printed lines on both sides: each rank's wait lasted 3 s
    by its time.monotonic, time.time and perf_counter, the monitor woke about 6 times and read
    the time pass. The simulated side reaches the deadline by waking the monitor itself, not in
    the monitor's wall time, and its clocks read the deadline after it."""
    sim, real = short_run.sim.report, short_run.real.report
    c = compare_reports(sim, real)
    assert c.agree, format_comparison(c)
    for rep in (sim, real):
        _ended_by_the_timeout(rep)
        _timed_out(rep, SHORT_S, True)
    assert sim.ranks[0].error.message == f"Timed out waiting {SHORT_S * 1000}ms for recv operation to complete", sim.notes


def test_torchs_default_timeout_is_reached_in_simulated_time_in_seconds(script_zygote, short_run):
    """The same script with torch's default timeout (30 min) and tqdm's 10 s monitor: real
    Gloo raises after 30 min; the simulator used to sit until its watchdog (every wake of the
    monitor came before the deadline). Now it wakes the monitor 180 times in simulated time:
    the ranks' waits end at 1800 s simulated with the words of the real 3 s run, their clocks
    read 1800 s, and it takes seconds of wall time."""
    run_id = new_run_id()
    rep = run_script(BAR, ["10", "0"], nproc_per_node=2, backend="gloo", timeout_s=120, run_id=run_id,
                     measure_compute=False, zygote=script_zygote("sim"), stdout=subprocess.DEVNULL)
    assert tagged_processes(run_id) == [] and descendants(script_zygote("sim").pid) == []
    real = short_run.real.report
    _ended_by_the_timeout(rep)
    assert rep.ranks[0].error.message == "Timed out waiting 1800000ms for recv operation to complete"
    assert _said(rep) == [[line.replace(f"[{SHORT_S}, {SHORT_S}, {SHORT_S}]", "[1800, 1800, 1800]")
                           .replace(f"{SHORT_S * 1000}ms", "1800000ms") for line in lines] for lines in _said(real)]
    assert [r.location.line for r in rep.ranks] == [r.location.line for r in real.ranks]
    assert all(1800 <= r.time < 1802 for r in rep.ranks), [r.time for r in rep.ranks]  # (+ the 0.5, 1.5 s sleeps)
    assert rep.timings["wall_s"] < 60, rep.timings  # (measured 4-10 s; the watchdog's 120 s before)


@pytest.mark.parametrize(("timeout", "ending"), [("2", ["error", "completed"]), ("0", ["hang", "hang"])])
def test_past_the_cap_a_threads_timers_run_in_wall_time_again(script_zygote, monkeypatch, timeout, ending):
    """A thread that wakes too often to be woken all the way (here every 10 ms, the cap at 20
    wakes) is woken up to the cap, then its timer runs in wall time as before: a 2 s timeout
    still ends the waits as on real Gloo, torch's default is left to the watchdog; the report
    says where the cap stopped the wakes."""
    from simdist.script import timedwakes

    monkeypatch.setattr(timedwakes, "MAX_WAKES", 20)
    run_id = new_run_id()
    rep = run_script(BAR, ["0.01", timeout], nproc_per_node=2, backend="gloo", timeout_s=8, run_id=run_id,
                     measure_compute=False, zygote=script_zygote("sim"), stdout=subprocess.DEVNULL)
    assert tagged_processes(run_id) == [] and descendants(script_zygote("sim").pid) == []
    assert [r.status for r in rep.ranks] == ending, rep.notes
    if timeout != "0":
        assert rep.ranks[0].error.message == "Timed out waiting 2000ms for recv operation to complete"
        assert rep.ranks[1].output[1].startswith("1 raised after [2, 2, 2] s: Timed out waiting 2000ms"), rep.ranks[1].output
    else:
        assert any(n.startswith("watchdog:") for n in rep.notes), rep.notes
    note = [n for n in rep.notes if n.startswith("timed waits:")]
    assert len(note) == 1 and "woke threads in timed waits 20 times" in note[0] and "every 0.01 s" in note[0], rep.notes


def test_a_rank_asleep_in_timed_waits_past_a_deadline_cannot_post_before_it():
    """`deadlines.overdue`: rank 0 waits until 3 s on rank 1, which is past it; rank 0's own
    side thread sleeps in a timed wait until 4 s: nothing can post before 3 s, the deadline
    is due (before, a rank with such a thread counted as one that could post: its deadline
    waited for the other rank's exit, and its clocks read that exit's wall time). Until 2.5 s
    it may post first."""
    from types import SimpleNamespace

    from simdist.script.deadlines import overdue

    def rank(r: int, clock: float, wake: float | None):
        return SimpleNamespace(rank=r, clock=clock, blocked=lambda: False, wake_at=lambda: wake, exit=None)

    late = rank(1, 5.0, None)
    assert overdue(lambda _call, r: r == 1, None, 3.0, rank(0, 0.0, 4.0), [rank(0, 0.0, 4.0), late])
    owner = rank(0, 0.0, 2.5)
    assert not overdue(lambda _call, r: r == 1, None, 3.0, owner, [owner, late])


WAKE_PROBE = r"""
import queue, threading, time
from simdist.script.rank import client, timedwait

class Recorder:  # the client's timed-wait bookkeeping: which wait each thread told, by number
    def __init__(self):
        self.told = queue.SimpleQueue()
    def timed_wait(self, s, number):
        self.told.put((client.thread_key(), number, s))
    def timed_woken(self, idents):
        pass
    def timed_over(self, timer):
        pass

rec = client.CLIENT = Recorder()
timedwait.install()
out = {}

def get():
    t0, w0 = time.monotonic(), time.time()
    try:
        queue.Queue().get(timeout=30)
    except queue.Empty:
        out["get"] = (round(time.monotonic() - t0), round(time.time() - w0))

def wait(ev):
    t0 = time.perf_counter()
    out.setdefault("wait", []).append((ev.wait(30), round(time.perf_counter() - t0)))

real0 = timedwait.simclock.real_monotonic()
t = threading.Thread(target=get); t.start()
key, number, s = rec.told.get(timeout=10)
timedwait._woken({"tid": key, "n": number + 1})  # a stale wake (another wait's number): nothing
timedwait._woken({"tid": key, "n": number})
t.join(10)
ev = threading.Event()
t = threading.Thread(target=wait, args=(ev,)); t.start()
key, number, s = rec.told.get(timeout=10)
timedwait._woken({"tid": key, "n": number})
t.join(10)
ev = threading.Event()
t = threading.Thread(target=wait, args=(ev,)); t.start()
key, number, s = rec.told.get(timeout=10)
time.sleep(0.1)
ev.set()  # notified first: the wake that follows finds the wait over
timedwait._woken({"tid": key, "n": number})
t.join(10)
print("results", out["get"], out["wait"], round(timedwait.simclock.real_monotonic() - real0))
"""


def test_a_wake_ends_the_wait_it_names_as_its_timer_would_with_the_clocks_moved_on():
    """The rank side of a wake (`rank.timedwait._wake`): a `Queue.get(timeout=30)` raises Empty
    at once, 30 s later by the script's time.monotonic and time.time (the queue module's own
    name for monotonic moved too, or it would wait its 30 s again); an `Event.wait(30)` returns
    False 30 s later by perf_counter; a wake naming another wait does nothing, and one that
    comes after a notify finds the wait over (it returned True). No wall time passed."""
    import sys

    out = subprocess.run([sys.executable, "-c", WAKE_PROBE], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "results (30, 30) [(False, 30), (True, 0)] 0" in out.stdout, out.stdout


def test_a_real_tqdm_bar_reaches_torchs_default_timeout_in_simulated_time(script_zygote):
    """tqdm_timeout.py: a loop under a real tqdm bar (its monitor thread loops on
    `Event.wait(10)`) hangs. With a 3 s timeout both sides agree; with torch's default the
    simulated ranks print the same lines at 1800 s, and tqdm's own clock (`from time import
    time`, bound when torch imports tqdm) read the 30 minutes too. tqdm is no dependency of
    simdist: skipped where it is not installed."""
    pytest.importorskip("tqdm")
    script = ROOT / "tests" / "scripts" / "tqdm_timeout.py"
    run_id = new_run_id()
    both = compare_script(script, ["3"], nproc_per_node=2, backend="gloo", timeout_s=120, hang_after_s=3.0,
                          run_id=run_id, measure_compute=False, zygotes=script_zygote)
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    said = _said(both.real.report)
    assert said[0][-1] == "0 raised after 3 s: Timed out waiting 3000ms for recv operation to complete", said
    run_id = new_run_id()
    rep = run_script(script, ["0"], nproc_per_node=2, backend="gloo", timeout_s=120, run_id=run_id,
                     measure_compute=False, zygote=script_zygote("sim"), stdout=subprocess.DEVNULL)
    assert tagged_processes(run_id) == [] and descendants(script_zygote("sim").pid) == []
    assert _said(rep) == [[line.replace(" 3 s:", " 1800 s:").replace("3000ms", "1800000ms") for line in lines]
                          for lines in said]
    assert any("30:00<" in line for r in rep.ranks for line in r.stderr), rep.ranks[0].stderr  # tqdm's elapsed
    assert rep.timings["wall_s"] < 60, rep.timings


def test_a_heartbeat_thread_sleeping_in_a_loop_is_a_timed_wait(script_zygote):
    """progress_bar_timeout.py KIND sleep: the side thread is a heartbeat looping on
    `time.sleep(INTERVAL)`. With a 3 s timeout both sides print the same lines (each wait lasted
    3 s by its clocks, the heartbeat woke about 6 times); with torch's default and a 10 s
    heartbeat the simulated ranks print them at 1800 s, in seconds of wall time. Before, a
    sleeping side thread counted as one that could post: the run sat until the watchdog and
    was called a hang (measured: 47 s to a 40 s watchdog), where real Gloo raises at 30 min."""
    run_id = new_run_id()
    both = compare_script(BAR, ["0.5", str(SHORT_S), "sleep"], nproc_per_node=2, backend="gloo", timeout_s=120,
                          hang_after_s=3.0, run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    for rep in (both.sim.report, both.real.report):
        _ended_by_the_timeout(rep)
        _timed_out(rep, SHORT_S, True)
    run_id = new_run_id()
    rep = run_script(BAR, ["10", "0", "sleep"], nproc_per_node=2, backend="gloo", timeout_s=120, run_id=run_id,
                     measure_compute=False, zygote=script_zygote("sim"), stdout=subprocess.DEVNULL)
    assert tagged_processes(run_id) == [] and descendants(script_zygote("sim").pid) == []
    _ended_by_the_timeout(rep)
    assert _said(rep) == [[line.replace(f"[{SHORT_S}, {SHORT_S}, {SHORT_S}]", "[1800, 1800, 1800]")
                           .replace(f"{SHORT_S * 1000}ms", "1800000ms") for line in lines] for lines in _said(both.real.report)]
    assert rep.timings["wall_s"] < 60, rep.timings  # (measured 7.8 s; the watchdog's 120 s before)


def test_a_sleep_polling_a_peers_child_runs_in_wall_time(script_zygote):
    """polls_peer_child.py: rank 1 polls for a file rank 0's child writes after 2 s, rank 0 waits
    in a barrier with a 10 s timeout. Both sides complete, rank 1's clock reading the wait's wall
    time. Sleeps woken in simulated time while a rank has a child process ran rank 1's clock
    ~100 s ahead in 2 s of wall time and fired rank 0's timeout ("sim error, real completed")."""
    run_id = new_run_id()
    both = compare_script(ROOT / "tests" / "scripts" / "polls_peer_child.py", ["10"], nproc_per_node=2, backend="gloo",
                          timeout_s=120, hang_after_s=3.0, run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    for rep in (both.sim.report, both.real.report):
        assert [r.status for r in rep.ranks] == ["completed", "completed"], (rep.source, rep.notes)
        assert rep.ranks[1].output == ["rank 1 saw the file; its clock read under a minute: True", "rank 1 done"], rep.source


def test_sleep_reads_its_length_as_the_builtin(script_zygote):
    """sleep_lengths.py: a tensor, a numpy float32 or a str raise TypeError, a negative, NaN or
    infinity what the builtin raises, on the main thread and another, on both sides. The told
    sleep read the length with `float()` and slept a tensor's and a float32's (a str's error
    named `>`). `time.sleep` pickles as itself, as the builtin (it raised "cannot pickle 'staticmethod'
    object" on both sides, which compare cannot see)."""
    both = compare_script(ROOT / "tests" / "scripts" / "sleep_lengths.py", [], nproc_per_node=2, backend="gloo",
                          timeout_s=120, hang_after_s=3.0, run_id=new_run_id(), measure_compute=False, zygotes=script_zygote)
    c = compare_reports(both.sim.report, both.real.report)
    assert c.agree, format_comparison(c)
    for rep in (both.sim.report, both.real.report):
        lines = rep.ranks[0].output
        assert "time.sleep pickles as itself: True" in lines, (rep.source, lines)
        for where in ("main", "thread"):
            assert f"{where} Tensor tensor(0.0100): TypeError: only integer tensors of a single element can be " \
                   "converted to an index" in lines, (rep.source, lines)
            assert f"{where} float32 np.float32(0.01): TypeError: 'numpy.float32' object cannot be interpreted " \
                   "as an integer" in lines, (rep.source, lines)
            assert f"{where} float 0.01: slept" in lines, (rep.source, lines)
