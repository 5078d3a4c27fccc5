"""A thread of the script in a timed wait (`rank.timedwait`): a progress bar's monitor does not
keep Gloo's timeout from ending waits that can no longer complete.

tests/scripts/timed_wait_thread.py: rank 1 does one fewer all_reduce than rank 0 and then waits
in a recv, while a thread of each rank loops on `Event.wait(INTERVAL)` (as tqdm's monitor
does on `Event.wait(10)`), with init's `timeout=` 2 s. On real Gloo both ranks raise Gloo's
timeout error at 2 s. The simulator used to count the waiting thread as one that could post,
so no rank was ever blocked, the deadlines never fired, and the run ended at the watchdog
("sim hang, real error"). Now a thread in a timed wait posts nothing before its timer ends:
a deadline due before that fires at once, and one due after the thread's wakes fires once
its (wall-clock) wakes have moved its timeline past the deadline."""

from __future__ import annotations

import pytest

from simdist.compare import compare_reports, format_comparison
from simdist.script.api import compare_script
from simdist.script.launch import new_run_id, tagged_processes
from tests.conftest import ROOT, descendants, line_of

pytestmark = pytest.mark.real

SCRIPT = ROOT / "tests" / "scripts" / "timed_wait_thread.py"


@pytest.mark.parametrize(("interval", "nproc"), [("60", 2), ("0.3", 2), ("60", 3)])
def test_a_thread_in_a_timed_wait_leaves_gloos_timeout_to_end_the_waits(script_zygote, interval, nproc):
    """INTERVAL 60: the thread's timer ends long after Gloo's 2 s timeout, which fires on the
    simulated side as soon as every rank blocks (not after the thread's 60 s, nor at the
    watchdog). INTERVAL 0.3: the thread wakes six times before the deadline, posting nothing."""
    run_id = new_run_id()
    both = compare_script(SCRIPT, [interval, "2"], nproc_per_node=nproc, backend="gloo", timeout_s=120,
                          hang_after_s=3.0, run_id=run_id, measure_compute=False, zygotes=script_zygote)
    assert tagged_processes(run_id) == [] and all(descendants(script_zygote(m).pid) == [] for m in ("sim", "gloo"))
    sim, real = both.sim.report, both.real.report
    # rank r does 3 - r all_reduces: the last rank is in its recv, the others in the all_reduce it never joins
    lines = [line_of(SCRIPT, "dist.all_reduce(t)")] * (nproc - 1) + [line_of(SCRIPT, "dist.recv(t, src=0)")]
    for rep in (sim, real):
        assert [r.status for r in rep.ranks] == ["error"] * nproc, (rep.source, rep.notes)
        assert [r.error.category for r in rep.ranks] == ["timeout"] * nproc, (rep.source, rep.notes)
        assert [r.location.line for r in rep.ranks] == lines, rep.source
    assert all(r.error.message == "Timed out waiting 2000ms for recv operation to complete" for r in sim.ranks), sim.notes
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
    def timed_wait(self, s):
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
    import subprocess
    import sys

    out = subprocess.run([sys.executable, "-c", NOTIFY_PROBE], capture_output=True, text=True, timeout=60, cwd=ROOT)
    assert out.returncode == 0, out.stderr
    assert "after-notify []" in out.stdout, out.stdout
