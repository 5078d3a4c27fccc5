"""Real-backend workers forked by a zygote (`real_backend.workers.WorkerZygote`) are what
launched workers are: the same report for every way a run ends, the same Flight Recorder
dumps and error files, and the launcher's guarantees (nothing outlives a hang, SIGKILL of
the launcher, Ctrl-C) hold for them too."""

from __future__ import annotations

import json
import os
import pickle
import re
import signal
import subprocess
import sys
import time
from dataclasses import asdict
from pathlib import Path

import pytest

from simdist.compare import error_view
from simdist.scenario import load_scenario

from .conftest import ROOT, descendants

pytest.importorskip("torch")
from real_backend.launch import run_real  # noqa: E402

pytestmark = pytest.mark.real
REAL = Path(__file__).resolve().parent / "scenarios_real"
_TIMES = {"t_issue", "t_done", "time", "t_begin", "t_end"}  # (t_begin, t_end: phase spans)


def _same_run(report) -> dict:
    """What a run's report says about the ranks, without what differs between any two runs:
    times, the ports in Gloo's messages, and a backend error's wording (`compare.error_view`:
    Gloo words one lost peer two ways, by TCP timing)."""

    def strip(x):
        if isinstance(x, dict):
            return {k: strip(v) for k, v in x.items() if k not in _TIMES}
        if isinstance(x, list):
            return [strip(v) for v in x]
        if isinstance(x, str):
            return re.sub(r"\d+\.\d+ s|\]:\d+", "#", x)
        return x

    ranks = [asdict(r) | {"error": error_view(r.error)} for r in report.ranks]
    return strip({"outcome": report.outcome, "ranks": ranks, "notes": report.notes})


def _dumps(folder: Path) -> dict[str, object]:
    """Each file torch's variables made the ranks leave in `folder`: a Flight Recorder dump's
    collectives, an error file's error."""
    out: dict[str, object] = {}
    for p in sorted(folder.rglob("*")):
        if p.name.startswith("comm_lib_trace_rank_"):
            entries = pickle.loads(p.read_bytes())["entries"]
            out[p.name] = [(e["profiling_name"], e["collective_seq_id"], e["input_sizes"], e["retired"])
                           for e in entries]
        elif p.name == "error.json":
            out[str(p.relative_to(folder))] = json.loads(p.read_text())["message"]["message"].split(":")[0]
    return out


@pytest.mark.parametrize("name", ["counter", "hang_stay", "peer_lost", "gloo_abort"])
def test_a_forked_worker_reports_what_a_launched_one_does(name, tmp_path, real_zygote):
    s = load_scenario(REAL / f"{name}.toml")
    launched = run_real(s, fr_dumps=tmp_path / "launched")
    forked = run_real(s, fr_dumps=tmp_path / "forked", zygote=real_zygote)
    assert _same_run(forked) == _same_run(launched)
    assert launched.outcome == s.expect.outcome
    assert _dumps(tmp_path / "forked") == _dumps(tmp_path / "launched") != {}
    assert descendants(real_zygote.pid) == [], "a forked worker outlived its run"


def test_nothing_outlives_a_hang_of_forked_workers(real_zygote):
    s = load_scenario(REAL / "hang_stay.toml")  # rank 0 stays after its program; rank 1 blocks
    report = run_real(s, zygote=real_zygote)
    assert [r.status for r in report.ranks] == ["completed", "hang"]
    assert descendants(real_zygote.pid) == []
    assert real_zygote.proc.alive()  # the zygote serves the next run


_LAUNCHER = """
import sys
from pathlib import Path
from real_backend.launch import run_real
from real_backend.workers import WorkerZygote
from simdist.compare import error_view
from simdist.scenario import load_scenario
with WorkerZygote() as z:
    print(z.pid, flush=True)
    try:
        run_real(load_scenario(sys.argv[1]), workdir=Path(sys.argv[2]), zygote=z)
    except KeyboardInterrupt:
        sys.exit(130)
"""


def _launch_and_wait_for_loop(wd: Path) -> tuple[subprocess.Popen, int, list[int]]:
    """A launcher process running sigkill.toml's long loop with forked workers, once both ranks
    are inside it: (the launcher, its zygote's pid, the workers' pids)."""
    proc = subprocess.Popen([sys.executable, "-c", _LAUNCHER, str(REAL / "sigkill.toml"), str(wd)], cwd=ROOT,
                            stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    assert proc.stdout is not None
    zygote = int(proc.stdout.readline())
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline:
        docs = [json.loads(p.read_text()) for p in (wd / "rank0.progress", wd / "rank1.progress") if p.exists()]
        if len(docs) == 2 and all((d.get("iteration") or 0) >= 1 for d in docs):
            return proc, zygote, [d["pid"] for d in docs]
        time.sleep(0.1)
    proc.kill()
    raise AssertionError("the forked ranks never reached their loop")


def _gone(pids: list[int], within_s: float = 10.0) -> list[int]:
    deadline = time.monotonic() + within_s
    while (alive := [p for p in pids if Path(f"/proc/{p}").exists() and not _zombie(p)]) and time.monotonic() < deadline:
        time.sleep(0.05)
    return alive


def _zombie(pid: int) -> bool:
    try:
        return Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] in ("Z", "X")
    except OSError:
        return True


def test_sigkill_of_the_launcher_leaves_no_forked_worker_and_no_zygote(tmp_path):
    proc, zygote, workers = _launch_and_wait_for_loop(tmp_path / "wd")
    assert sorted(descendants(zygote)) == sorted(workers)
    os.kill(proc.pid, signal.SIGKILL)
    proc.wait()
    assert _gone([zygote, *workers]) == [], "a process outlived its SIGKILLed launcher"


def test_ctrl_c_stops_forked_workers_and_keeps_a_partial_report(tmp_path):
    wd = tmp_path / "wd"
    proc, zygote, workers = _launch_and_wait_for_loop(wd)
    proc.send_signal(signal.SIGINT)
    _, err = proc.communicate(timeout=60)
    assert proc.returncode == 130 and b"interrupted" in err, err[-2000:]
    partial = json.loads((wd / "report.partial.json").read_text())
    assert [r["status"] for r in partial["ranks"]] == ["aborted", "aborted"]
    assert all(r["error"]["type"] == "KeyboardInterrupt" and r["trace"] for r in partial["ranks"])
    assert _gone([zygote, *workers]) == []
