"""Launch a scenario on real torch.distributed processes and turn their records into a Report.

`run_real(scenario)` starts `world_size` worker processes on this host (rendezvous at a
store this launcher hosts on 127.0.0.1 only; Gloo on CPU over the loopback interface, NCCL
with one GPU per rank), watches them, and collects their per-rank results
(``rank<r>.json``) from a work directory. Processes, store, signals and the watchdog's
clock come from `simdist.procs`, the launcher every local rank process goes through.

* **Watchdog.** Each worker rewrites ``rank<r>.progress`` whenever its progress fingerprint
  changes (step boundaries, Flight Recorder enqueue/complete counters; a rank in a
  compute/sleep step or still starting counts as progressing). When no rank has made
  progress for `timeout_s` (default: the scenario's, 10 s) the run hangs: every rank still
  running its program is told ``hang`` on its stdin, records which collective it is
  blocked in, and exits.
* **Cleanup.** Workers run in their own sessions; whatever happens (a rank killed, an
  exception here, Ctrl-C / SIGTERM) every worker is told to stop, then killed after a
  grace period, and reaped. Workers also exit on their own when their stdin closes, so a
  killed launcher leaves nothing behind. Workers forked by a zygote (`zygote=`, see
  `real_backend.workers`) are watched, told, killed and reaped the same way, and die with
  the zygote, which dies with its launcher. On Ctrl-C the partial report is written to
  ``report.partial.json`` in the (kept) work directory and KeyboardInterrupt propagates.
* **torchrun.** Without this launcher, run ``torchrun ... -m real_backend.worker SCENARIO
  --out DIR`` on every node (each rank's watchdog then uses the c10d store) and
  ``python -m real_backend.launch collect SCENARIO DIR`` to build the report.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import re
import signal
import sys
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import IO, Any

from real_backend.workers import WorkerZygote, start_worker, worker_env
from simdist.errors import HostError
from simdist.limits import LOCAL_RANKS, check_timeout
from simdist.procs import LocalProcess, LocalProcesses, Watchdog, interrupt_event, loopback_store
from simdist.program.budget import check_ops
from simdist.report import (
    SHUTDOWN_ABORT,
    RankError,
    RankResult,
    Report,
    Span,
    TraceEntry,
    overall_outcome,
    shutdown_abort,
)
from simdist.scenario import Scenario, check_target
from simdist.tempdir import TempDir

STARTUP_LIMIT_S = 120.0  # longest a rank may spend importing torch and in the rendezvous
GRACE_S = 5.0  # how long ranks get to write their records before they are killed
POLL_S = 0.05


@dataclass
class _Rank:
    """One worker process and what the watchdog knows of it."""

    rank: int
    proc: LocalProcess
    log_path: Path
    progress: str | None = None  # the worker's last progress fingerprint
    iteration: int | None = None
    starting: bool = True
    result_at: float | None = None  # when its rank<r>.json appeared
    told: str | None = None  # the control line it was sent

    def tell(self, cmd: str) -> None:
        """Send one control line (hang, release, interrupt); a worker acts on the first only,
        except that a rank told ``hang`` records its hang and then waits for one more (`end`)."""
        if self.told is None and self.proc.alive():
            self.told = cmd
            self.proc.tell(cmd)

    def end(self) -> None:
        """The run's hang is recorded everywhere: a rank told ``hang`` may exit now."""
        if self.told == "hang" and self.proc.alive():
            self.told = "end"
            self.proc.tell("end")


def check_host(scenario: Scenario) -> None:
    """Raise HostError (one line) when this machine cannot run the scenario locally."""
    w = scenario.world_size
    if scenario.backend == "nccl":
        try:
            import torch
        except ImportError as err:  # pragma: no cover - torch is a dependency
            raise HostError(f"the real backend needs torch ({err})") from None
        n = torch.cuda.device_count() if torch.cuda.is_available() else 0
        if n < w:
            raise HostError(f"backend 'nccl' needs {w} CUDA devices (one per rank) on this host, found {n}")
    else:
        LOCAL_RANKS.check(w, "world_size", f"{w:,} CPU rank processes on this host")


def run_real(
    scenario: Scenario,
    *,
    timeout_s: float | None = None,
    workdir: Path | None = None,
    progress: bool = False,
    kill_at: tuple[int, int] | None = None,
    fr_dumps: Path | None = None,
    fr_on_demand: bool = False,
    zygote: WorkerZygote | None = None,
) -> Report:
    """Run `scenario` on real processes of this host and return their Report (source "real").

    `timeout_s` overrides the scenario's watchdog timeout. `workdir` keeps the per-rank
    results and logs there (default: a temporary directory, removed afterwards).
    `progress` prints one line per event (rank ended, watchdog) to stderr. `kill_at =
    (rank, iteration)` SIGKILLs that rank once it has entered that loop iteration (tests).
    `fr_dumps`: a folder that gets what a production job leaves there, through torch's own
    environment variables (`simdist.flightrec.format.fr_env`): each rank's Flight Recorder dump and torchelastic error
    file; `fr_on_demand` also opens each rank's control-plane socket there (``rank<r>.sock``).
    `zygote`: a fork server (`real_backend.workers.WorkerZygote`) that forks the workers
    instead of starting an interpreter for each (for callers that run many real runs).
    """
    check_host(scenario)
    check_target(scenario, "real", scenario.name)
    check_ops(scenario)
    timeout = scenario.timeout_s if timeout_s is None else check_timeout(timeout_s, "timeout_s")
    if timeout != scenario.timeout_s:
        scenario = scenario.model_copy(update={"timeout_s": timeout})
    # Our own folder goes with us, even when this process is SIGKILLed (its reaper removes it).
    tmp = TempDir("simdist-real-") if workdir is None else None
    wd = tmp.path if tmp is not None else Path(workdir)  # type: ignore[arg-type]
    wd.mkdir(parents=True, exist_ok=True)
    for stale in list(wd.glob("rank*.json")) + list(wd.glob("rank*.progress")):
        stale.unlink()
    try:
        report, interrupted = _run(scenario, wd, timeout, progress, kill_at, fr_dumps, fr_on_demand,
                                   watch=tmp.watch if tmp is not None else None, zygote=zygote)
        if interrupted:
            if tmp is not None:
                tmp.keep()
            (wd / "report.partial.json").write_text(report.to_json())
            print(f"simdist: interrupted; partial report in {wd / 'report.partial.json'}", file=sys.stderr)
            raise KeyboardInterrupt
        if tmp is None:
            (wd / "report.json").write_text(report.to_json())
        return report
    finally:
        if tmp is not None:
            tmp.close()


def _run(
    scenario: Scenario, wd: Path, timeout: float, progress: bool, kill_at: tuple[int, int] | None,
    fr_dumps: Path | None = None, fr_on_demand: bool = False,
    watch: Callable[[int], None] | None = None, zygote: WorkerZygote | None = None,
) -> tuple[Report, bool]:
    spec = wd / "scenario.json"
    spec.write_text(json.dumps(scenario.model_dump(mode="json", by_alias=True)))
    # The rendezvous store lives here, not in rank 0: a rank that finishes (and exits) early
    # must not take the store down while its peers are still setting up.
    store = loopback_store(scenario.world_size)  # kept alive for the whole run
    dog = Watchdog(timeout, STARTUP_LIMIT_S)
    with interrupt_event() as interrupted, contextlib.ExitStack() as logs, LocalProcesses() as procs:
        ranks = []
        for r in range(scenario.world_size):
            log_path = wd / f"rank{r}.log"
            log: IO[bytes] = logs.enter_context(open(log_path, "wb"))  # noqa: SIM115 - the stack closes it
            proc = start_worker(procs, [str(spec), "--out", str(wd), "--control", "stdin"],
                                worker_env(r, scenario.world_size, store.port, fr_dumps, fr_on_demand), log, zygote)
            ranks.append(_Rank(r, proc, log_path))
            if watch is not None:
                watch(proc.pid)
        fired_at = _watch(ranks, procs, wd, dog, progress, kill_at, interrupted)
        procs.reap(GRACE_S)
    del store
    hang = fired_at is not None
    wall = time.monotonic() - dog.started
    report = collect(scenario, wd, ranks=ranks, hang=hang)
    report.notes.append(f"real run: {scenario.world_size} ranks on {scenario.backend}, wall {wall:.2f} s")
    if hang:
        blocked = [r.rank for r in report.ranks if r.status == "hang"]
        report.notes.append(
            f"watchdog fired after {fired_at:.2f} s: no progress for {timeout:g} s; blocked ranks {blocked}"
        )
    return report, interrupted.is_set()


def _watch(ranks: list[_Rank], procs: LocalProcesses, wd: Path, dog: Watchdog, progress: bool,
           kill_at: tuple[int, int] | None, interrupted: threading.Event) -> float | None:
    """Poll the ranks until all ended, Ctrl-C, or the watchdog fired (then: seconds after start)."""
    while True:
        now = time.monotonic()
        if _observe(ranks, procs, wd, now, dog.started, progress):
            dog.progressed(now)
        if kill_at is not None and _kill_at(ranks, kill_at):
            kill_at = None
        if all(rk.proc.ended_at is not None for rk in ranks):
            return None
        if interrupted.is_set():
            for rk in ranks:
                rk.tell("interrupt")
            return None
        if all(rk.result_at is not None or rk.proc.ended_at is not None for rk in ranks):
            for rk in ranks:  # every program is over: staying ranks may go
                rk.tell("release")
        dead = any(rk.proc.ended_at is not None and rk.result_at is None for rk in ranks)
        starting = any(rk.starting and rk.proc.ended_at is None for rk in ranks) and not dead
        if dog.fired(now, starting=starting):
            if progress:
                print(f"[real] watchdog: no progress for {dog.timeout_s:g} s", file=sys.stderr)
            _tell_hang(ranks, procs, wd, dog.started)
            return now - dog.started
        time.sleep(POLL_S)


def _tell_hang(ranks: list[_Rank], procs: LocalProcesses, wd: Path, t_start: float) -> None:
    """Tell every rank that the run hangs: the blocked ones first, and nobody exits until those
    have all recorded where they are blocked -- any rank's exit would fail a blocked peer's
    collective (peer lost) and that rank would record an error, not the hang. A blocked rank
    records its hang and waits for `end`; a finished rank exits when told."""
    blocked = [rk for rk in ranks if rk.result_at is None]
    for rk in blocked:
        rk.tell("hang")
    deadline = time.monotonic() + GRACE_S
    while time.monotonic() < deadline and any(rk.result_at is None and rk.proc.alive() for rk in blocked):
        _observe(ranks, procs, wd, time.monotonic(), t_start, False)
        time.sleep(POLL_S)
    for rk in blocked:
        rk.end()
    for rk in ranks:
        rk.tell("hang")


def _observe(ranks: list[_Rank], procs: LocalProcesses, wd: Path, now: float, t_start: float,
             progress: bool) -> bool:
    """Update each rank from its process and files; True when any rank made progress."""
    moved = False
    for p in procs.poll(now):
        moved = True
        if progress:
            rk = next(rk for rk in ranks if rk.proc is p)
            print(f"[real] rank {rk.rank} ended (rc {p.returncode}) after {now - t_start:.1f} s", file=sys.stderr)
    for rk in ranks:
        if rk.result_at is None and (wd / f"rank{rk.rank}.json").exists():
            rk.result_at = now
            moved = True
        doc = _read_json(wd / f"rank{rk.rank}.progress")
        if doc is not None and doc.get("fp") != rk.progress:
            rk.progress = doc.get("fp")
            rk.iteration = doc.get("iteration")
            rk.starting = bool(doc.get("starting"))
            moved = True
    return moved


def _kill_at(ranks: list[_Rank], kill_at: tuple[int, int]) -> bool:
    """Tests: SIGKILL rank kill_at[0] once it is in iteration kill_at[1]; True when done."""
    victim = ranks[kill_at[0]]
    if victim.iteration is None or victim.iteration < kill_at[1] or not victim.proc.alive():
        return False
    victim.proc.killed_by_us = True
    with contextlib.suppress(ProcessLookupError):
        os.kill(victim.proc.pid, signal.SIGKILL)
    return True


def _read_json(path: Path) -> dict[str, Any] | None:
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return None


_WHAT = re.compile(r"what\(\):\s*(.*)")
_THROWN = re.compile(r"terminate called after throwing an instance of '([^']+)'")


def _abort_details(log_text: str) -> tuple[str, str] | None:
    """(exception type, what() line) from a rank's log after std::terminate."""
    m = _WHAT.search(log_text)
    if not m:
        return None
    t = _THROWN.search(log_text)
    return (t.group(1) if t else "std::terminate", m.group(1).strip())


def _aborted_after_record(rc: int | None, doc: dict[str, Any] | None, log_text: str) -> bool:
    """`simdist.report.shutdown_abort` for a scenario's rank: it had finished when it wrote a
    record other than "aborted" (a Gloo abort mid-run is recorded as aborted by the terminate
    hook), and the log names any C++ exception in flight (``terminate called after throwing
    an instance of ...``)."""
    return shutdown_abort(rc, finished=doc is not None and doc.get("status") != "aborted",
                          thrown=_THROWN.search(log_text) is not None)


def _signal_name(sig: int) -> str:
    try:
        return signal.Signals(sig).name
    except ValueError:
        return f"signal {sig}"


def _result_from_doc(doc: dict[str, Any]) -> RankResult:
    return RankResult(
        rank=int(doc["rank"]),
        status=doc["status"],
        inputs_processed=int(doc.get("inputs_processed", 0)),
        error=RankError(**doc["error"]) if doc.get("error") else None,
        observed=doc.get("observed", {}),
        trace=[TraceEntry(**e) for e in doc.get("trace", [])],
        time=float(doc.get("time", 0.0)),
        blocked_in=TraceEntry(**doc["blocked_in"]) if doc.get("blocked_in") else None,
        waiting_in=TraceEntry(**doc["waiting_in"]) if doc.get("waiting_in") else None,
        warnings=list(doc.get("warnings", [])),
        phases=[Span(**sp) for sp in doc.get("phases", [])],
    )


def collect(scenario: Scenario, wd: Path, *, ranks: list[_Rank] | None = None, hang: bool = False) -> Report:
    """Build the Report from the per-rank result files in `wd` (and, when this launcher ran
    them, the processes' exit statuses and logs)."""
    results: list[RankResult] = []
    notes: list[str] = []
    by_rank = {rk.rank: rk for rk in ranks or []}
    for r in range(scenario.world_size):
        doc = _read_json(wd / f"rank{r}.json")
        rk = by_rank.get(r)
        rc = rk.proc.returncode if rk is not None else None
        log_text = ""
        log_path = rk.log_path if rk is not None else wd / f"rank{r}.log"
        with contextlib.suppress(OSError):
            log_text = log_path.read_text(errors="replace")
        if doc is not None:
            res = _result_from_doc(doc)
        else:
            # No record: the rank died before writing one (signal), or never started.
            res = RankResult(rank=r, status="aborted")
            if rk is not None:
                prog = _read_json(wd / f"rank{r}.progress") or {}
                res.inputs_processed = max(0, int(prog.get("iteration") or 0))
            if rc is not None and rc < 0:
                res.error = RankError("Signal", f"killed by {_signal_name(-rc)}", "killed")
            elif hang and rk is not None and rk.proc.killed_by_us:
                res.status = "hang"
                res.error = None
                notes.append(f"rank {r}: did not answer the watchdog, killed; no record")
            else:
                res.error = RankError("ExitCode", f"ended with exit code {rc} without a record", "other")
        if _aborted_after_record(rc, doc, log_text):
            # Gloo's threads at interpreter exit (no exception in flight): the work was done
            notes.append(f"rank {r}: ended by SIGABRT after it had finished and written its record "
                         f"(status {res.status}): {SHUTDOWN_ABORT}")
        elif rc is not None and rc < 0 and -rc == signal.SIGABRT:
            details = _abort_details(log_text)
            res.status = "aborted"
            if details is not None:
                res.error = RankError(details[0], details[1], "gloo_abort")
            elif res.error is None or res.error.category != "gloo_abort":
                res.error = RankError("Signal", "killed by SIGABRT", "killed")
        elif rc is not None and rc < 0 and doc is not None and res.status not in ("hang",):
            # killed after writing a record (e.g. while staying): keep the record's status
            notes.append(f"rank {r}: process ended by {_signal_name(-rc)} after writing its record")
        results.append(res)
    # Which peer a rank lost: the ranks whose process had ended before its error was recorded.
    if ranks:
        for res in results:
            if res.error is not None and res.error.category == "peer_lost":
                t_err = by_rank[res.rank].result_at or float("inf")
                gone = [
                    rk.rank for rk in ranks if rk.rank != res.rank and rk.proc.ended_at is not None and rk.proc.ended_at <= t_err
                ]
                if not gone:  # ended in the same polling interval
                    gone = [
                        rk.rank
                        for rk in ranks
                        if rk.rank != res.rank
                        and rk.result_at is not None
                        and rk.result_at <= t_err
                        and results[rk.rank].status != "hang"
                    ]
                notes.append(f"rank {res.rank}: lost peer(s) {gone}")
    for res in results:
        if res.status == "aborted" and res.error is not None and res.error.category == "killed":
            notes.append(f"rank {res.rank}: {res.error.message}")
    return Report(
        scenario=scenario.name,
        source="real",
        outcome=overall_outcome([r.status for r in results]),
        ranks=results,
        backend=scenario.backend,
        world_size=scenario.world_size,
        notes=notes,
    )


def main(argv: list[str] | None = None) -> int:
    """``python -m real_backend.launch run SCENARIO`` / ``collect SCENARIO DIR``."""
    from real_backend.worker import load_any

    ap = argparse.ArgumentParser(prog="python -m real_backend.launch")
    sub = ap.add_subparsers(dest="cmd", required=True)
    run_p = sub.add_parser("run", help="run a scenario on local processes")
    run_p.add_argument("scenario")
    run_p.add_argument("--timeout", type=float, default=None)
    run_p.add_argument("--workdir", type=Path, default=None)
    col_p = sub.add_parser("collect", help="build the report from a torchrun output directory")
    col_p.add_argument("scenario")
    col_p.add_argument("dir", type=Path)
    args = ap.parse_args(argv)
    scenario = load_any(args.scenario)
    if args.cmd == "run":
        report = run_real(scenario, timeout_s=args.timeout, workdir=args.workdir, progress=True)
    else:
        report = collect(scenario, args.dir)
    print(report.to_json())
    return 0 if report.outcome == "completed" else 1


if __name__ == "__main__":
    sys.exit(main())
