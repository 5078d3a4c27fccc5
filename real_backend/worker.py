"""One rank of a scenario on real torch.distributed: the process around its program.

Run by `real_backend.launch` (one process per rank, env:// rendezvous, control over stdin)
or directly under torchrun::

    torchrun --nproc-per-node 2 -m real_backend.worker scenario.toml --out results/

The program is exactly docs/scenarios.md: init the process group, create the groups in
file order, then the actions `simdist.program` makes of the scenario (the DDP chain model,
the optimizer, the custom joinables, ``with Join([...], ...)``, the loop steps for each of
this rank's inputs, the `after` steps), executed by `real_backend.torchrank`; then
`on_finish`. Each rank writes ``rank<r>.json`` (a RankResult plus extras) to the output
directory: when its program ends, when it raises, when C++ terminates it (Gloo abort), or
when the launcher's watchdog tells it that the run hangs. As torch does in production, it also
writes its Flight Recorder dump to ``${TORCH_FR_DUMP_TEMP_FILE}<rank>`` and its uncaught
exception to ``TORCHELASTIC_ERROR_FILE`` when those are set, and answers torch's control plane
(``fr_trace_json`` on demand) on ``TORCH_WORKER_SERVER_SOCKET``.

Control protocol (``--control stdin``): one line from the launcher ends the process:
``hang`` (record a hang if still running), ``interrupt`` (user pressed Ctrl-C) or
``release`` (everyone is done: a staying rank may exit). EOF (the launcher died) counts as
``interrupt``. A running rank told ``hang`` records it, then waits for one more line
(``end``, once every blocked rank has recorded) or EOF before it exits. Progress goes the other way through ``rank<r>.progress`` (rewritten when it
changes), which the launcher's watchdog reads. Under torchrun (``--control store``) the
same happens through the c10d store: each rank's watchdog thread sees global progress.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from real_backend.record import FR_BUFFER_SIZE, FR_ENV

EXIT_OK, EXIT_ERROR, EXIT_HANG = 0, 1, 3
FAULT_ENV = "SIMDIST_FAULT"  # tests only: inject a fault the real backend must report right
PROGRESS_PERIOD_S = 0.1
STARTUP_LIMIT_S = 120.0  # torchrun mode: start-up counts as progress for at most this long


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Worker:
    """A rank's process around its program (`TorchRank`): progress for the watchdog, the
    control channel, and the result file, whichever way the program ends."""

    def __init__(self, scenario: Any, rank: int, world_size: int, local_rank: int, out: Path, control: str):
        self.s = scenario
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.out = out
        self.control = control
        self.t0_ns = time.time_ns()
        self.prog: Any = None  # the TorchRank, once torch is imported
        self.lock = threading.Lock()
        self.written = False
        self.finished = False  # the program is over (completed or raised)
        self.hang_told = False  # the launcher said the run hangs: this rank ends as a hang

    @property
    def store(self) -> Any:
        return self.prog.store if self.prog is not None else None

    @property
    def dist_ready(self) -> bool:
        return self.prog is not None and self.prog.dist_ready

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        from real_backend.failure import categorise, install_terminate_hook, record_error_file, serve_on_demand

        install_terminate_hook(self._on_terminate)
        threading.Thread(target=warm_symbolizer, name="simdist-warmup", daemon=True).start()
        threading.Thread(target=self._progress_loop, name="simdist-progress", daemon=True).start()
        if self.control == "stdin":
            threading.Thread(target=self._control_loop, name="simdist-control", daemon=True).start()
        status, error = "completed", None
        try:
            from real_backend.torchrank import TorchRank  # imports torch

            # torch's control-plane server, when TORCH_WORKER_SERVER_SOCKET is set; only once torch
            # is imported (started while the warm-up thread imports torch, it terminates the process)
            serve_on_demand()

            self.prog = TorchRank(self.s, self.rank, self.world_size, self.local_rank, self.t0_ns)
            self.prog.run()
        except BaseException as exc:  # noqa: BLE001 - every failure is a result
            if self.hang_told:  # the run's end failed the blocked call: the control thread records and exits
                threading.Event().wait()
            status, error = "error", categorise(exc)
            if not self.written:  # not after the watchdog's hang record: that is how this rank ended
                record_error_file(exc)  # torchelastic's error file, when TORCHELASTIC_ERROR_FILE is set
        self.finished = True
        self.write_result(status, error)
        self._announce_end()
        if status == "completed" and self.s.on_finish == "stay":
            self._stay()
        self._end(status == "completed")

    def _end(self, clean: bool) -> None:
        """`exit`: destroy the process group and end the process (peers see it gone)."""
        if clean and self.dist_ready:
            import torch.distributed as dist

            guard = threading.Timer(3.0, lambda: self._exit(EXIT_OK))
            guard.daemon = True
            guard.start()
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self._exit(EXIT_OK if clean else EXIT_ERROR)

    def _exit(self, code: int) -> None:
        """The end of the process, whether destroy_process_group returned or its guard fired
        (under load it can take longer than the guard): an injected fault happens either way."""
        if os.environ.get(FAULT_ENV) == "terminate_at_exit":
            _terminate()
        self._hard_exit(code)

    @staticmethod
    def _hard_exit(code: int) -> None:
        with contextlib.suppress(Exception):
            sys.stdout.flush()
            sys.stderr.flush()
        os._exit(code)

    def _stay(self) -> None:
        """`stay`: alive, silent, until everyone is done (launcher or store says so)."""
        if self.control == "stdin":
            threading.Event().wait()  # the control thread ends the process
        last, since = -1, time.monotonic()
        while True:
            try:
                n = int(self.store.add("simdist/ended", 0))
            except Exception:
                return  # the store (hosted by a peer) is gone: nobody left to wait for
            if n >= self.world_size:
                return
            if n != last:
                last, since = n, time.monotonic()
            elif time.monotonic() - since > self.s.timeout_s + 5:
                return
            time.sleep(PROGRESS_PERIOD_S)

    def _announce_end(self) -> None:
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.add("simdist/ended", 1)

    # ------------------------------------------------------------------ background threads
    def _fingerprint(self) -> tuple:
        from real_backend.record import fr_progress

        p = self.prog
        if p is None:
            return (0, (), 0)
        fr = fr_progress() if p.dist_ready else ()
        return (p.counter, fr, time.monotonic_ns() if p.busy else 0)

    def _progress_loop(self) -> None:
        last: Any = None
        path = self.out / f"rank{self.rank}.progress"
        others: dict[int, Any] = {}
        last_change = started = time.monotonic()
        while True:
            fp = self._fingerprint()
            state = "done" if self.finished else "running"
            doc = {
                "fp": repr(fp),
                "iteration": self.prog.iteration if self.prog is not None else None,
                "state": state,
                "starting": self.prog is None or self.prog.starting,
                "pid": os.getpid(),
            }
            if doc != last:
                last = doc
                last_change = time.monotonic()
                if self.control == "stdin":
                    with contextlib.suppress(OSError):
                        _atomic_write(path, json.dumps(doc))
                elif self.store is not None:
                    with contextlib.suppress(Exception):
                        self.store.set(f"simdist/progress/{self.rank}", repr(fp))
            if self.control == "store" and not self.finished:
                # torchrun: no launcher; each rank watches global progress through the store.
                changed = False
                if self.store is not None:
                    for r in range(self.world_size):
                        try:
                            v = (
                                self.store.get(f"simdist/progress/{r}")
                                if self.store.check([f"simdist/progress/{r}"])
                                else None
                            )
                        except Exception:
                            v = None
                        if others.get(r) != v:
                            others[r], changed = v, True
                starting = self.prog is None or self.prog.starting
                if changed or (starting and time.monotonic() - started < STARTUP_LIMIT_S):
                    last_change = time.monotonic()
                if time.monotonic() - last_change > self.s.timeout_s:
                    self.write_result("hang", None)
                    self._announce_end()
                    # exit 0: a failing worker makes torchrun kill its peers before they record
                    self._hard_exit(EXIT_OK)
            time.sleep(PROGRESS_PERIOD_S)

    def _control_loop(self) -> None:
        line = sys.stdin.buffer.readline()
        cmd = line.decode(errors="replace").strip() or "interrupt"
        if self.finished:  # the main thread is writing (or has written) the final record
            deadline = time.monotonic() + 30
            while not self.written and time.monotonic() < deadline:
                time.sleep(0.01)
        else:
            # The record is written when it can be; the process ends in any case (the launcher
            # may be gone, and its folder with it).
            if cmd == "hang":
                self.hang_told = True
                with contextlib.suppress(Exception):
                    self.write_result("hang", None)
                # exit only when every blocked rank has recorded its hang (`end`, or EOF: the
                # launcher is gone): exiting now would fail a blocked peer's collective (peer
                # lost) before it records where it is blocked, and it would record an error
                sys.stdin.buffer.readline()
                self._hard_exit(EXIT_HANG)
            from simdist.report import RankError

            with contextlib.suppress(Exception):
                self.write_result("aborted", RankError("KeyboardInterrupt", "run interrupted", "killed"))
            self._hard_exit(EXIT_ERROR)
        # finished and recorded: a staying rank may go; this is a finished rank's exit like
        # `_end`'s (the launcher's release can come while destroy_process_group still runs)
        self._exit(EXIT_OK)

    def _on_terminate(self) -> None:
        """std::terminate (Gloo abort): record what we have; the launcher adds the what() line."""
        from simdist.report import RankError

        self.write_result("aborted", RankError("SIGABRT", "", "gloo_abort"), wait_retired=False)

    # ------------------------------------------------------------------ result
    def write_result(self, status: str, error: Any, *, wait_retired: bool = True) -> None:
        from real_backend.record import build_trace, dump_fr_bytes, first_pending, waiting_entry, write_dump_file
        from simdist.report import phase_spans

        if not self.lock.acquire(timeout=10):
            return
        try:
            if self.written:
                return
            fr = raw = None
            if self.dist_ready:
                import pickle

                # work that returned to the program (it completed, or raised afterwards) has completed,
                # but FR retires it a little later: wait for that, not for a blocked rank's pending work
                deadline = time.monotonic() + (0.5 if wait_retired and status in ("completed", "error") else 0)
                while True:
                    try:
                        raw = dump_fr_bytes()
                        fr = pickle.loads(raw)
                    except Exception:
                        fr = raw = None
                        break
                    # the last entry's retirement can lag the Python return by a little
                    if all(e.get("retired") for e in fr.get("entries", [])) or time.monotonic() >= deadline:
                        break
                    time.sleep(0.05)
            if raw is not None:
                with contextlib.suppress(OSError):
                    write_dump_file(self.rank, raw)  # where TORCH_FR_DUMP_TEMP_FILE says, as torch does
            if fr is not None and os.environ.get("SIMDIST_KEEP_FR"):
                (self.out / f"rank{self.rank}.fr.pkl").write_bytes(raw or b"")
            p = self.prog
            if p is not None:
                p.marks.post_hook_root = p.post_hook_root()
            t_end = time.time_ns()
            deferred: list[bool] = []
            trace = build_trace(fr, p.marks, t_end, deferred) if p is not None else []
            blocked = first_pending(trace) if status == "hang" else None
            waiting = waiting_entry(trace, deferred) if status == "hang" else None
            if error is not None and error.category in ("peer_lost", "timeout") and trace:
                # FR retires failed work like finished work: the call that raised is the last one
                trace[-1].completed, trace[-1].t_done = False, None
            doc = {
                "rank": self.rank,
                "status": status,
                "inputs_processed": p.inputs_processed if p is not None else 0,
                "error": asdict(error) if error is not None else None,
                "observed": p.observed_snapshot() if p is not None else {},
                "trace": [asdict(e) for e in trace],
                "time": (t_end - self.t0_ns) / 1e9,
                "phases": [asdict(sp) for sp in phase_spans(
                    [((t - self.t0_ns) / 1e9, ph, it) for t, ph, it in p.marks.phases], (t_end - self.t0_ns) / 1e9)]
                if p is not None else [],
                "blocked_in": asdict(blocked) if blocked is not None else None,
                "waiting_in": asdict(waiting) if waiting is not None else None,
                "warnings": list(p.warnings) if p is not None else [],
                "iteration": p.iteration if p is not None else None,
                "pid": os.getpid(),
                "fr_entries": len(fr.get("entries", [])) if fr else 0,
            }
            _atomic_write(self.out / f"rank{self.rank}.json", json.dumps(doc, default=_json_default))
            self.written = True
        finally:
            self.lock.release()


def _terminate() -> None:
    """Fault injection (tests, FAULT_ENV=terminate_at_exit): what Gloo's threads sometimes do
    at interpreter exit under load, std::terminate with no exception in flight (SIGABRT,
    "terminate called without an active exception"), after the record is written."""
    import ctypes

    with contextlib.suppress(OSError, AttributeError):
        ctypes.CDLL("libstdc++.so.6")._ZSt9terminatev()


def warm_symbolizer() -> None:
    """Pay the one-time cost of traceback symbolization (seconds; the first Flight Recorder
    dump with entries pays it otherwise) in the background, while the rank starts up.
    It runs mostly without the GIL."""
    with contextlib.suppress(Exception):
        from torch._C._profiler import gather_traceback, symbolize_tracebacks

        symbolize_tracebacks([gather_traceback(True, False, False)])


def _json_default(o: Any) -> Any:
    if isinstance(o, float) and o != o:
        return None
    if hasattr(o, "item"):
        return o.item()
    raise TypeError(f"not JSON serialisable: {type(o)}")


def load_any(path: str) -> Any:
    """A scenario the real backend can run, from .toml (load_scenario) or .json (parse_scenario)."""
    from simdist.scenario import load_scenario, parse_scenario

    if path.endswith(".json"):
        return parse_scenario(json.loads(Path(path).read_text()), source=path, target="real")
    return load_scenario(path, target="real")


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(prog="python -m real_backend.worker", description=__doc__.splitlines()[0])
    ap.add_argument("scenario", help="scenario file (.toml or .json)")
    ap.add_argument("--out", required=True, help="directory for rank<r>.json results")
    ap.add_argument(
        "--control",
        choices=["stdin", "store"],
        default="store",
        help="stdin: driven by real_backend.launch; store: standalone (torchrun)",
    )
    args = ap.parse_args(argv)
    os.environ.setdefault(FR_ENV, FR_BUFFER_SIZE)
    from simdist.errors import ScenarioError

    try:
        scenario = load_any(args.scenario)
    except ScenarioError as e:
        print(f"error: {e}", file=sys.stderr)
        sys.exit(2)
    rank = int(os.environ["RANK"])
    world_size = int(os.environ["WORLD_SIZE"])
    if world_size != scenario.world_size:
        print(f"error: scenario world_size is {scenario.world_size} but WORLD_SIZE={world_size}", file=sys.stderr)
        sys.exit(2)
    local_rank = int(os.environ.get("LOCAL_RANK", rank))
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    Worker(scenario, rank, world_size, local_rank, out, args.control).run()


if __name__ == "__main__":
    main()
