"""One rank of a scenario on real torch.distributed: builds the objects, runs the program.

Run by `real_backend.launch` (one process per rank, env:// rendezvous, control over stdin)
or directly under torchrun::

    torchrun --nproc-per-node 2 -m real_backend.worker scenario.toml --out results/

The program is exactly docs/scenarios.md: init the process group, create the groups in
file order, build the DDP chain model, the optimizer (optionally ZeRO), the custom
joinables, then ``with Join([...], enable, throw_on_early_termination, **kwargs)`` (or no
context) run the loop steps for each of this rank's inputs, then the `after` steps, then
`on_finish`. Each rank writes ``rank<r>.json`` (a RankResult plus extras) to the output
directory: when its program ends, when it raises, when C++ terminates it (Gloo abort), or
when the launcher's watchdog tells it that the run hangs.

Control protocol (``--control stdin``): one line from the launcher ends the process:
``hang`` (record a hang if still running), ``interrupt`` (user pressed Ctrl-C) or
``release`` (everyone is done: a staying rank may exit). EOF (the launcher died) counts as
``interrupt``. Progress goes the other way through ``rank<r>.progress`` (rewritten when it
changes), which the launcher's watchdog reads. Under torchrun (``--control store``) the
same happens through the c10d store: each rank's watchdog thread sees global progress.
"""

from __future__ import annotations

import argparse
import contextlib
import datetime
import json
import os
import sys
import threading
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

from real_backend.record import FR_BUFFER_SIZE, FR_ENV, Marks, P2PRecord, StepWindow
from simdist.vocab import reduce_op_of, root_of

EXIT_OK, EXIT_ERROR, EXIT_HANG = 0, 1, 3
PROGRESS_PERIOD_S = 0.1
STARTUP_LIMIT_S = 120.0  # torchrun mode: start-up counts as progress for at most this long


def _atomic_write(path: Path, text: str) -> None:
    tmp = path.with_suffix(path.suffix + ".tmp")
    tmp.write_text(text)
    os.replace(tmp, path)


class Worker:
    def __init__(self, scenario: Any, rank: int, world_size: int, local_rank: int, out: Path, control: str):
        self.s = scenario
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.out = out
        self.control = control
        self.t0_ns = time.time_ns()
        self.marks = Marks(t0_ns=self.t0_ns)
        self.marks.group_sizes = {"WORLD": world_size, **{g.name: len(g.ranks) for g in scenario.groups}}
        self.lock = threading.Lock()
        self.written = False
        self.finished = False  # the program is over (completed or raised)
        self.dist_ready = False
        self.counter = 0  # bumped at every step/iteration boundary: the watchdog's progress signal
        self.busy = False  # in a compute/sleep step: counts as progress
        self.starting = True  # importing torch / in the rendezvous: counts as progress (bounded)
        self.iteration: int | None = None
        self.inputs_processed = 0
        self.observed: dict[str, list[Any]] = {}
        self.pending: list[tuple[Any, Any]] = []  # (work, on_done) waited at end of iteration
        self.unwaited: list[Any] = []  # async work never waited (kept alive)
        self.p2p_seq = 0
        self.loss: Any = None
        self.ddp: Any = None
        self.optimizer: Any = None
        self.joinables: dict[str, Any] = {}
        self.groups: dict[str, Any] = {}
        self.device: Any = None
        self.store: Any = None
        self.pg_timeout_s = float(scenario.timeout_s) + 60.0

    # ------------------------------------------------------------------ lifecycle
    def run(self) -> None:
        from real_backend.record import categorise, install_terminate_hook

        install_terminate_hook(self._on_terminate)
        threading.Thread(target=_warm_symbolizer, name="simdist-warmup", daemon=True).start()
        threading.Thread(target=self._progress_loop, name="simdist-progress", daemon=True).start()
        if self.control == "stdin":
            threading.Thread(target=self._control_loop, name="simdist-control", daemon=True).start()
        status, error = "completed", None
        try:
            self.program()
        except BaseException as exc:  # noqa: BLE001 - every failure is a result
            status, error = "error", categorise(exc)
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

            guard = threading.Timer(3.0, lambda: self._hard_exit(EXIT_OK))
            guard.daemon = True
            guard.start()
            with contextlib.suppress(Exception):
                dist.destroy_process_group()
        self._hard_exit(EXIT_OK if clean else EXIT_ERROR)

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

    def _setup_barrier(self) -> None:
        """Store-only barrier (invisible to the Flight Recorder): nobody starts the loop, and so
        nobody can finish and exit, before every rank has built its objects. Without it a rank
        with nothing to do may exit while a peer is still constructing, which makes real runs
        nondeterministic. Gives up after a while (a rank that failed in setup never arrives)."""
        if self.store is None:
            return
        with contextlib.suppress(Exception):
            if int(self.store.add("simdist/setup_done", 1)) >= self.world_size:
                self.store.set("simdist/all_set_up", "1")
            self.store.wait(["simdist/all_set_up"], datetime.timedelta(seconds=min(self.s.timeout_s, 30)))

    def _announce_end(self) -> None:
        if self.store is not None:
            with contextlib.suppress(Exception):
                self.store.add("simdist/ended", 1)

    # ------------------------------------------------------------------ background threads
    def _fingerprint(self) -> tuple:
        from real_backend.record import fr_progress

        fr = fr_progress() if self.dist_ready else ()
        return (self.counter, fr, time.monotonic_ns() if self.busy else 0)

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
                "iteration": self.iteration,
                "state": state,
                "starting": self.starting,
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
                if changed or (self.starting and time.monotonic() - started < STARTUP_LIMIT_S):
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
            if cmd == "hang":
                self.write_result("hang", None)
                self._hard_exit(EXIT_HANG)
            from simdist.report import RankError

            self.write_result("aborted", RankError("KeyboardInterrupt", "run interrupted", "killed"))
            self._hard_exit(EXIT_ERROR)
        self._hard_exit(EXIT_OK)  # finished and recorded: a staying rank may go

    def _on_terminate(self) -> None:
        """std::terminate (Gloo abort): record what we have; the launcher adds the what() line."""
        from simdist.report import RankError

        self.write_result("aborted", RankError("SIGABRT", "", "gloo_abort"), wait_retired=False)

    # ------------------------------------------------------------------ result
    def _observed_snapshot(self) -> dict[str, Any]:
        obs: dict[str, Any] = {k: list(v) for k, v in self.observed.items()}
        for name, j in self.joinables.items():
            kind = self.s.joinable_kind(name)
            with contextlib.suppress(Exception):
                if kind == "counter":
                    obs[f"{name}.count"] = float(j.count.item())
                    obs[f"{name}.max_count"] = float(j.max_count.item())
                else:
                    obs[f"{name}.total"] = float(j.total_sum)
                    obs[f"{name}.post_hook_tensor"] = float(j.post_hook_tensor.item())
        return obs

    def _post_hook_root(self) -> int | None:
        root = getattr(self.ddp, "_authoritative_rank", None) if self.ddp is not None else None
        for j in self.joinables.values():
            if root is None and j.last_common_rank is not None:
                root = j.last_common_rank
        return None if root is None else int(root)

    def write_result(self, status: str, error: Any, *, wait_retired: bool = True) -> None:
        from real_backend.record import build_trace, dump_fr, first_pending, waiting_entry

        if not self.lock.acquire(timeout=10):
            return
        try:
            if self.written:
                return
            fr = None
            if self.dist_ready:
                deadline = time.monotonic() + (0.5 if wait_retired and status == "completed" else 0)
                while True:
                    try:
                        fr = dump_fr()
                    except Exception:
                        fr = None
                        break
                    # the last entry's retirement can lag the Python return by a little
                    if all(e.get("retired") for e in fr.get("entries", [])) or time.monotonic() >= deadline:
                        break
                    time.sleep(0.05)
            if fr is not None and os.environ.get("SIMDIST_KEEP_FR"):
                import pickle

                (self.out / f"rank{self.rank}.fr.pkl").write_bytes(pickle.dumps(fr))
            self.marks.post_hook_root = self._post_hook_root()
            t_end = time.time_ns()
            deferred: list[bool] = []
            trace = build_trace(fr, self.marks, t_end, deferred)
            blocked = first_pending(trace) if status == "hang" else None
            waiting = waiting_entry(trace, deferred) if status == "hang" else None
            if error is not None and error.category in ("peer_lost", "timeout") and trace:
                # FR retires failed work like finished work: the call that raised is the last one
                trace[-1].completed, trace[-1].t_done = False, None
            doc = {
                "rank": self.rank,
                "status": status,
                "inputs_processed": self.inputs_processed,
                "error": asdict(error) if error is not None else None,
                "observed": self._observed_snapshot(),
                "trace": [asdict(e) for e in trace],
                "time": (t_end - self.t0_ns) / 1e9,
                "blocked_in": asdict(blocked) if blocked is not None else None,
                "waiting_in": asdict(waiting) if waiting is not None else None,
                "warnings": [],
                "iteration": self.iteration,
                "pid": os.getpid(),
                "fr_entries": len(fr.get("entries", [])) if fr else 0,
            }
            _atomic_write(self.out / f"rank{self.rank}.json", json.dumps(doc, default=_json_default))
            self.written = True
        finally:
            self.lock.release()

    # ------------------------------------------------------------------ the program
    def _phase(self, phase: str, iteration: int | None) -> None:
        self.marks.phases.append((time.time_ns(), phase, iteration))
        self.counter += 1

    def program(self) -> None:
        import torch
        import torch.distributed as dist
        from torch.distributed.algorithms.join import Join
        from torch.nn.parallel import DistributedDataParallel as DDP

        from real_backend.joinables import AllReducer, Counter
        from real_backend.model import ChainModel

        s = self.s
        torch.manual_seed(s.seed)
        if s.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        self._phase("init", None)
        kw: dict[str, Any] = {}
        if s.backend == "nccl":
            kw["device_id"] = self.device
        if os.environ.get("SIMDIST_HOSTED_STORE"):
            # local launch: the launcher hosts the store (see launch._host_store)
            kw["store"] = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), self.world_size,
                                        is_master=False, timeout=datetime.timedelta(seconds=self.pg_timeout_s))
        else:
            kw["init_method"] = "env://"
        dist.init_process_group(
            backend=s.backend,
            rank=self.rank,
            world_size=self.world_size,
            timeout=datetime.timedelta(seconds=self.pg_timeout_s),
            **kw,
        )
        self.dist_ready = True
        with contextlib.suppress(Exception):
            self.store = dist.distributed_c10d._get_default_store()
        world = dist.group.WORLD
        self._name_pg(world, "WORLD")
        for g in s.groups:
            # new_group does not inherit init_process_group's timeout (30 min default otherwise)
            pg = dist.new_group(g.ranks, group_desc=g.name, timeout=datetime.timedelta(seconds=self.pg_timeout_s))
            if self.rank in g.ranks:
                self.groups[g.name] = pg
                self._name_pg(pg, g.name)

        if s.model is not None:
            module = ChainModel(s.model, self.device)
            opts: dict[str, Any] = {}
            if not s.model.broadcast_buffers:  # passed only when set: the default warns in torch 2.13
                opts["broadcast_buffers"] = False
            if s.model.bucket_cap_mb is not None:  # None: torch's default (25 MiB, 1 MiB first bucket)
                opts["bucket_cap_mb"] = s.model.bucket_cap_mb
            self.ddp = DDP(
                module,
                device_ids=[self.local_rank] if s.backend == "nccl" else None,
                find_unused_parameters=s.model.find_unused_parameters,
                gradient_as_bucket_view=s.model.gradient_as_bucket_view,
                **opts,
            )
        if s.optimizer is not None:
            cls = torch.optim.SGD if s.optimizer.kind == "sgd" else torch.optim.Adam
            params = list(self.ddp.parameters()) if self.ddp is not None else [torch.nn.Parameter(torch.zeros(1))]
            if s.optimizer.zero:
                from torch.distributed.optim import ZeroRedundancyOptimizer

                self.optimizer = ZeroRedundancyOptimizer(params, optimizer_class=cls, lr=s.optimizer.lr)
                self.marks.zero_roots = [
                    r
                    for r, groups in enumerate(self.optimizer._partition_parameters())
                    for pg in groups
                    for _ in pg["params"]
                ]
            else:
                self.optimizer = cls(params, lr=s.optimizer.lr)
        for j in s.joinables:
            if j.kind not in ("counter", "allreducer"):
                raise RuntimeError(f"joinable kind '{j.kind}' has no real implementation (only counter, allreducer)")
            pg = world if j.group == "WORLD" else self.groups.get(j.group, world)
            self.joinables[j.name] = (Counter if j.kind == "counter" else AllReducer)(self.device, pg)

        self._setup_barrier()
        if s.join is not None:
            objs = [self._joinable(n) for n in s.join.joinables]
            ctx: Any = Join(
                objs,
                enable=s.join.enabled,
                throw_on_early_termination=s.join.throw_on_early_termination,
                **s.join.kwargs,
            )
            self.marks.join_enabled = s.join.enabled
        else:
            ctx = contextlib.nullcontext()

        count = s.counts()[self.rank]
        self.starting = False  # setup (symmetric on all ranks) is over; from here on silence is a hang
        with ctx:
            for i in range(count):
                self.iteration = i
                self._phase("loop", i)
                for k, st in enumerate(s.loop):
                    if st.applies(self.rank, i):
                        self._step(st, "loop", k, i)
                self._wait_pending()
                self.loss = None
                self.inputs_processed += 1
            if s.join is not None:
                self._phase("join_exit", None)
        self.iteration = None
        self._phase("after", None)
        for k, st in enumerate(s.after):
            if st.applies(self.rank, None):
                self._step(st, "after", k, None)
        self._wait_pending()
        self.counter += 1

    def _name_pg(self, pg: Any, name: str) -> None:
        import torch.distributed as dist

        with contextlib.suppress(Exception):
            self.marks.pg_names[str(dist.distributed_c10d._get_process_group_name(pg))] = name

    def _joinable(self, name: str) -> Any:
        if name == "ddp":
            return self.ddp
        if name == "zero":
            return self.optimizer
        return self.joinables[name]

    def _wait_pending(self) -> None:
        pending, self.pending = self.pending, []
        self.marks.waiting_pending = True
        for work, on_done in pending:
            work.wait()
            on_done()
        self.marks.waiting_pending = False
        if pending:
            self.counter += 1

    # ------------------------------------------------------------------ steps
    def _step(self, st: Any, section: str, k: int, i: int | None) -> None:
        self.counter += 1
        kind = st.kind
        if kind in ("compute", "sleep"):
            self.busy = True
            try:
                time.sleep(st.seconds)
            finally:
                self.busy = False
        elif kind == "forward":
            x = self._tensor(1, self.s.model.dtype, 1.0, i)
            if st.no_sync:
                with self.ddp.no_sync():
                    self.loss = self.ddp(x).sum()
            else:
                self.loss = self.ddp(x).sum()
        elif kind == "backward":
            if self.loss is None:
                raise RuntimeError(f"{section}[{k}]: backward without a forward earlier in this iteration")
            loss, self.loss = self.loss, None
            loss.backward()
            if self.s.model.observe_grad:
                g = next(iter(self.ddp.module.parameters())).grad
                self.observed.setdefault("ddp.grad", []).append(None if g is None else float(g.flatten()[0].item()))
        elif kind == "optimizer_step":
            self.optimizer.step()
            self.optimizer.zero_grad()
        elif kind == "joinable_call":
            j = self.joinables[st.joinable]
            if self.s.joinable_kind(st.joinable) == "counter":
                j()
            else:
                n = getattr(st, "num_allreduces", None)
                if n is None:
                    n = int(self.s.join.kwargs.get("num_allreduces", 1)) if self.s.join is not None else 1
                j(n)
        elif kind == "collective":
            self._user_collective(st, self._label(st, section, k), i)
        elif kind == "p2p":
            self._p2p(st, self._label(st, section, k), i)
        self.counter += 1

    @staticmethod
    def _label(st: Any, section: str, k: int) -> str:
        name = getattr(st, "name", None)
        return f"user.{name}" if name else f"user.{section}[{k}]"

    def _tensor(self, numel: int, dtype: str, value: Any, i: int | None) -> Any:
        import torch

        from real_backend.model import torch_dtype

        if value == "rank":
            v: float = self.rank
        elif value == "iteration":
            v = i if i is not None else -1
        else:
            v = value
        return torch.full((numel,), v, dtype=torch_dtype(dtype), device=self.device)

    def _observe(self, name: str | None, result: Any) -> None:
        if name is None:
            return
        if result is None or result.numel() > 64:
            value = None
        else:
            vals = result.detach().cpu().flatten().tolist()
            value = vals if len(vals) != 1 else vals[0]
        self.observed.setdefault(name, []).append(value)

    def _user_collective(self, st: Any, label: str, i: int | None) -> None:
        """A raw collective step. The recorder recognises this function in FR frames."""
        import torch
        import torch.distributed as dist

        members = self.s.group_ranks(st.group)
        if self.rank not in members:
            return  # not a member: torch would skip it too
        group = None if st.group == "WORLD" else self.groups[st.group]
        gs = len(members)
        op = st.op
        t = self._tensor(st.numel, st.dtype, st.value, i)
        rop = getattr(dist.ReduceOp, st.reduce_op.upper())
        a = st.async_op
        result: Any = t
        outs: list[Any] | None = None
        win = StepWindow(
            time.time_ns(),
            None,
            label,
            op,
            st.numel,
            st.dtype,
            reduce_op_of(op, st.reduce_op),
            root_of(op, st.root),
            a,
            st.wait,
        )
        self.marks.steps.append(win)
        if op == "all_reduce":
            work = dist.all_reduce(t, op=rop, group=group, async_op=a)
        elif op == "broadcast":
            work = dist.broadcast(t, src=st.root, group=group, async_op=a)
        elif op == "all_gather":
            outs = [torch.empty_like(t) for _ in range(gs)]
            work = dist.all_gather(outs, t, group=group, async_op=a)
            result = None
        elif op == "reduce_scatter":
            result = torch.empty(st.numel // gs, dtype=t.dtype, device=t.device)
            work = dist.reduce_scatter_single(result, t, op=rop, group=group, async_op=a)
        elif op == "reduce":
            work = dist.reduce(t, dst=st.root, op=rop, group=group, async_op=a)
            result = t  # non-root: whatever the backend left in the input (Gloo uses it as scratch)
        elif op == "gather":
            outs = [torch.empty_like(t) for _ in range(gs)] if self.rank == st.root else None
            work = dist.gather(t, outs, dst=st.root, group=group, async_op=a)
            result = None
        elif op == "scatter":
            result = torch.empty(st.numel // gs, dtype=t.dtype, device=t.device)
            chunks = list(t.chunk(gs)) if self.rank == st.root else None
            work = dist.scatter(result, chunks, src=st.root, group=group, async_op=a)
        elif op == "all_to_all":
            result = torch.empty_like(t)
            work = dist.all_to_all_single(result, t, group=group, async_op=a)
        else:  # barrier
            work = dist.barrier(group=group, async_op=a)
            result = None
        win.t1_ns = time.time_ns()

        def done() -> None:
            r = torch.cat(outs) if outs is not None else result
            self._observe(st.observe, r)

        if a and st.wait == "never":
            self.unwaited.append(work)  # never waited, nothing observed
        elif a and st.wait == "end_of_iteration" and i is not None:
            self.pending.append((work, done))
        else:  # sync, or waited now (in `after`, end_of_iteration means now)
            if a:
                work.wait()
            done()

    def _p2p(self, st: Any, label: str, i: int | None) -> None:
        import torch.distributed as dist

        if self.rank not in (st.src, st.dst):
            return
        sending = self.rank == st.src
        t = self._tensor(st.numel, st.dtype, st.value if sending else 0, i)
        self.p2p_seq += 1
        rec = P2PRecord(
            time.time_ns(),
            "send" if sending else "recv",
            st.numel,
            st.dtype,
            st.dst if sending else st.src,
            label,
            not st.blocking,
            self.p2p_seq,
            wait=st.wait,
        )
        self.marks.p2p.append(rec)

        def done() -> None:
            rec.t_done_ns = time.time_ns()
            if not sending:
                self._observe(st.observe, t)

        if st.blocking:
            if sending:
                dist.send(t, dst=st.dst, tag=st.tag)
            else:
                dist.recv(t, src=st.src, tag=st.tag)
            done()
            return
        work = dist.isend(t, dst=st.dst, tag=st.tag) if sending else dist.irecv(t, src=st.src, tag=st.tag)
        if st.wait == "end_of_iteration" and i is not None:
            self.pending.append((work, done))
        else:
            work.wait()
            done()


def _warm_symbolizer() -> None:
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
    """A scenario from .toml (load_scenario) or .json (parse_scenario)."""
    from simdist.scenario import load_scenario, parse_scenario

    if path.endswith(".json"):
        return parse_scenario(json.loads(Path(path).read_text()), source=path)
    return load_scenario(path)


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
    scenario = load_any(args.scenario)
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
