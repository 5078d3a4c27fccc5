"""One rank on real torch.distributed: executes its program's actions and marks them for the recorder.

The real backend's driver of `simdist.program` (the simulator's is `simdist.simrank`):
everything the scenario means was decided by the interpreter; here an action becomes the
torch call the script of docs/scenarios.md makes. Alongside, it leaves the marks that
`real_backend.record` needs to label Flight Recorder entries: a phase mark per loop
iteration / Join exit / after section, a `StepWindow` around each user collective (the
recorder recognises `TorchRank.user_collective` in FR frames) and a `P2PRecord` per
send/recv (Gloo's FR does not record them). Python warnings the program shows (torch's
"does not belong to the given group", Join's skew warning) are kept for the report.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import threading
import time
import warnings
from typing import Any

import torch
import torch.distributed as dist

from real_backend.joinables import REAL_JOINABLES, ScenarioJoinable
from real_backend.marks import Marks, P2PRecord, StepWindow
from real_backend.model import ChainModel, torch_dtype
from simdist.program.actions import (
    P2P,
    Action,
    Backward,
    BuildJoinable,
    BuildModel,
    BuildOptimizer,
    CallJoinable,
    Collective,
    Compute,
    EndIteration,
    EnterJoin,
    EnterPhase,
    ExitJoin,
    Fail,
    Forward,
    SetupDone,
    SkipCollective,
    StepOptimizer,
    WaitDeferred,
)
from simdist.program.interpret import rank_actions
from simdist.scenario import Model, Scenario
from simdist.schema import BackwardStep
from simdist.vocab import OBSERVED_MAX_NUMEL, WORLD


class TorchRank:
    """The objects of one rank's program and the state its watchdog and result file read."""

    def __init__(self, scenario: Scenario, rank: int, world_size: int, local_rank: int, t0_ns: int):
        self.s = scenario
        self.rank = rank
        self.world_size = world_size
        self.local_rank = local_rank
        self.marks = Marks(t0_ns=t0_ns)
        self.marks.group_ranks = {WORLD: list(range(world_size)), **{g.name: sorted(g.ranks) for g in scenario.groups}}
        self.marks.group_sizes = {name: len(ranks) for name, ranks in self.marks.group_ranks.items()}
        self.pg_timeout_s = float(scenario.timeout_s) + 60.0
        self.dist_ready = False
        self.store: Any = None
        self.counter = 0  # bumped at every action: the watchdog's progress signal
        self.busy = False  # in a compute/sleep step: counts as progress
        self.starting = True  # importing torch / in the rendezvous / building: counts as progress (bounded)
        self.iteration: int | None = None
        self.inputs_processed = 0
        self.observed: dict[str, list[Any]] = {}
        self.warnings: list[str] = []
        self.deferred: list[tuple[Any, Any]] = []  # (work, on_done) waited at the end of the iteration
        self.unwaited: list[Any] = []  # async work never waited (kept alive)
        self.p2p_seq = 0
        self.losses: dict[str, Any] = {}  # this iteration's loss per model
        self.specs: dict[str, Model] = {}  # the DDP models this rank holds, by name
        self.ddp: dict[str, Any] = {}
        self.optimizer: Any = None
        self.joinables: dict[str, ScenarioJoinable] = {}
        self.groups: dict[str, Any] = {}  # every group's handle (NON_GROUP_MEMBER where not a member)
        self.device: Any = None

    # ------------------------------------------------------------------ the program
    def run(self) -> None:
        """The whole program; raises what it raises (the worker records it)."""
        self._init_process_group()
        shown = warnings.showwarning

        def keep(message: Any, category: Any, filename: str, lineno: int, file: Any = None, line: Any = None) -> None:
            if threading.current_thread() is threading.main_thread():
                self.warnings.append(str(message))
            shown(message, category, filename, lineno, file, line)

        warnings.showwarning = keep
        try:
            with contextlib.ExitStack() as join_block:  # a Join left by an exception gets __exit__(exc)
                for action in rank_actions(self.s, self.rank, self.latest):
                    self.counter += 1
                    self.execute(action, join_block)
                    self.counter += 1
        finally:
            warnings.showwarning = shown

    def latest(self, name: str) -> Any:
        """The latest result observed under `name` (what a `flag` condition reads)."""
        values = self.observed.get(name)
        return values[-1] if values else None

    def _init_process_group(self) -> None:
        s = self.s
        torch.manual_seed(s.seed)
        if s.backend == "nccl":
            torch.cuda.set_device(self.local_rank)
            self.device = torch.device("cuda", self.local_rank)
        else:
            self.device = torch.device("cpu")
        kw: dict[str, Any] = {"device_id": self.device} if s.backend == "nccl" else {}
        timeout = datetime.timedelta(seconds=self.pg_timeout_s)
        if os.environ.get("SIMDIST_HOSTED_STORE"):
            # local launch: the launcher hosts the store (see launch._host_store)
            kw["store"] = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), self.world_size,
                                        is_master=False, timeout=timeout)
        else:
            kw["init_method"] = "env://"
        dist.init_process_group(backend=s.backend, rank=self.rank, world_size=self.world_size, timeout=timeout, **kw)
        self.dist_ready = True
        with contextlib.suppress(Exception):
            self.store = dist.distributed_c10d._get_default_store()
        self._name_pg(dist.group.WORLD, WORLD)
        for g in s.groups:
            # new_group does not inherit init_process_group's timeout (30 min default otherwise)
            pg = dist.new_group(g.ranks, group_desc=g.name, timeout=timeout)
            self.groups[g.name] = pg
            if self.rank in g.ranks:
                self._name_pg(pg, g.name)

    def _name_pg(self, pg: Any, name: str) -> None:
        with contextlib.suppress(Exception):
            self.marks.pg_names[str(dist.distributed_c10d._get_process_group_name(pg))] = name

    def execute(self, a: Action, join_block: contextlib.ExitStack) -> None:
        """Do what `a` says, on torch."""
        match a:
            case Forward(model=name, no_sync=no_sync):
                ddp = self.ddp[name]
                x = torch.full((1,), 1.0, dtype=torch_dtype(self.specs[name].dtype), device=self.device)
                with ddp.no_sync() if no_sync else contextlib.nullcontext():
                    self.losses[name] = ddp(x).sum()
            case Backward(model=name, seconds=seconds):
                module = self.ddp[name].module
                if module.busy:
                    module.set_backward_seconds(seconds)
                self.busy = seconds > 0  # sleeping in backward counts as progress, as in a compute step
                try:
                    self.losses.pop(name).backward()
                finally:
                    self.busy = False
                if self.specs[name].observe_grad:
                    g = next(iter(self.ddp[name].module.parameters())).grad
                    self.observed.setdefault(f"{name}.grad", []).append(
                        None if g is None else float(g.flatten()[0].item()))
            case StepOptimizer():
                self.optimizer.step()
                self.optimizer.zero_grad()
            case Collective():
                self.user_collective(a)
            case SkipCollective(call=call):
                # torch decides: a non-member's call warns and returns None without communicating
                self._issue(call, self.groups[call.group], self._tensor(call.numel, call.dtype, call.value))
            case P2P():
                self._p2p(a)
            case CallJoinable(name=name, num_allreduces=n):
                self.joinables[name].call(n)
            case Compute(seconds=seconds):
                self.busy = True
                try:
                    time.sleep(seconds)
                finally:
                    self.busy = False
            case WaitDeferred():
                self._wait_deferred()
            case EnterPhase(phase=phase, iteration=iteration):
                self.marks.phases.append((time.time_ns(), phase, iteration))
                if phase == "loop":
                    self.iteration = iteration
                elif phase == "after":  # in the Join exit the last iteration stays the watchdog's
                    self.iteration = None
            case EndIteration():
                self.losses.clear()
                self.inputs_processed += 1
            case _:
                self._setup(a, join_block)

    def _setup(self, a: Action, join_block: contextlib.ExitStack) -> None:
        """The actions that happen once: building objects, entering and leaving Join, failing."""
        match a:
            case BuildModel(model=m, ddp_kwargs=kwargs):
                from torch.nn.parallel import DistributedDataParallel as DDP

                self.specs[m.name] = m
                device_ids = [self.local_rank] if self.s.backend == "nccl" else None
                busy = any(isinstance(st, BackwardStep) and st.seconds and self.s.model_named(st.model).name == m.name
                           for st in (*self.s.loop, *self.s.after))
                self.ddp[m.name] = DDP(ChainModel(m, self.device, busy), device_ids=device_ids,
                                       process_group=self._pg(m.group), **kwargs)
            case BuildOptimizer(optimizer=opt, models=names, group=group):
                self._build_optimizer(opt.kind, opt.lr, opt.zero, names, group)
            case BuildJoinable(name=name, kind=kind, group=group):
                # built only on the group's ranks (the interpreter decides)
                self.joinables[name] = REAL_JOINABLES[kind](self.device, self._pg(group) or dist.group.WORLD)
            case SetupDone():
                self._setup_barrier()
                self.starting = False  # setup (symmetric on all ranks) is over; from here on silence is a hang
            case EnterJoin():
                from torch.distributed.algorithms.join import Join

                objs = [self._joinable(n) for n in a.joinables]
                join_block.enter_context(Join(objs, enable=a.enable,
                                              throw_on_early_termination=a.throw_on_early_termination, **a.kwargs))
                self.marks.join_enabled = a.enable
            case ExitJoin():
                join_block.close()
            case Fail(message=message):
                raise RuntimeError(message)
            case _:  # pragma: no cover - the interpreter yields no other kind
                raise AssertionError(a)

    def _pg(self, group: str) -> Any:
        """The process group handle a torch object takes for `group` (None: the default group)."""
        return None if group == WORLD else self.groups[group]

    def _build_optimizer(self, kind: str, lr: float, zero: bool, models: tuple[str, ...], group: str) -> None:
        cls = torch.optim.SGD if kind == "sgd" else torch.optim.Adam
        params = [p for name in models for p in self.ddp[name].parameters()]
        if not zero:
            self.optimizer = cls(params or [torch.nn.Parameter(torch.zeros(1))], lr=lr)
            return
        from torch.distributed.optim import ZeroRedundancyOptimizer

        self.optimizer = ZeroRedundancyOptimizer(params, optimizer_class=cls, lr=lr, process_group=self._pg(group))
        members = self.s.group_ranks(group)  # the shard of group rank r is broadcast from its global rank
        self.marks.zero_roots = [
            members[r] for r, groups in enumerate(self.optimizer._partition_parameters()) for pg in groups
            for _ in pg["params"]
        ]

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

    def _joinable(self, name: str) -> Any:
        if name in self.ddp:
            return self.ddp[name]
        if name == "zero":
            return self.optimizer
        return self.joinables[name]

    def _wait_deferred(self) -> None:
        deferred, self.deferred = self.deferred, []
        self.marks.waiting_pending = True
        for work, on_done in deferred:
            work.wait()
            on_done()
        self.marks.waiting_pending = False

    # ------------------------------------------------------------------ what the result reports
    def observed_snapshot(self) -> dict[str, Any]:
        obs: dict[str, Any] = {k: list(v) for k, v in self.observed.items()}
        for name, j in self.joinables.items():
            with contextlib.suppress(Exception):
                obs.update(j.observed(name))
        return obs

    def post_hook_root(self) -> int | None:
        """The common rank the Join post hooks found (names their broadcasts' root); None when
        it is no rank of the group: a mismatched all-reduce can leave it holding Gloo's
        uninitialised scratch bytes (then the broadcast itself refuses it, and this rank's
        record must still be written)."""
        for name, ddp in self.ddp.items():
            root = getattr(ddp, "_authoritative_rank", None)
            if root is not None:
                members = self.s.group_ranks(self.specs[name].group)
                return members[int(root)] if 0 <= int(root) < len(members) else None
        for j in self.joinables.values():
            if j.last_common_rank is not None:
                return int(j.last_common_rank)
        return None

    # ------------------------------------------------------------------ communication steps
    def _tensor(self, numel: int, dtype: str, value: float | int) -> torch.Tensor:
        return torch.full((numel,), value, dtype=torch_dtype(dtype), device=self.device)

    def _observe(self, name: str | None, result: Any) -> None:
        if name is None:
            return
        if result is None or result.numel() > OBSERVED_MAX_NUMEL:
            value = None
        else:
            vals = result.detach().cpu().flatten().tolist()
            value = vals if len(vals) != 1 else vals[0]
        self.observed.setdefault(name, []).append(value)

    def user_collective(self, a: Collective) -> None:
        """A raw collective step. The recorder recognises this function in FR frames."""
        t = self._tensor(a.numel, a.dtype, a.value)
        win = StepWindow(time.time_ns(), None, a.origin, a.op, a.numel, a.dtype, a.reduce_op, a.root, a.async_op, a.wait)
        self.marks.steps.append(win)
        work, result = self._issue(a, None if a.group == WORLD else self.groups[a.group], t)
        win.t1_ns = time.time_ns()

        def done() -> None:
            self._observe(a.observe, result())

        if a.wait == "never":
            self.unwaited.append(work)  # never waited, nothing observed
        elif a.wait == "end_of_iteration":
            self.deferred.append((work, done))
        else:  # sync, or waited now
            if a.async_op:
                work.wait()
            done()

    def _issue(self, a: Collective, group: Any, t: torch.Tensor) -> tuple[Any, Any]:
        """Call torch.distributed for `a` on `group`: (its work, a function giving the result)."""
        gs = len(self.s.group_ranks(a.group))
        rop = getattr(dist.ReduceOp, (a.reduce_op or "sum").upper())
        root, op, asy = a.root, a.op, a.async_op
        if op == "all_reduce":
            return dist.all_reduce(t, op=rop, group=group, async_op=asy), lambda: t
        if op == "broadcast":
            return dist.broadcast(t, src=root, group=group, async_op=asy), lambda: t
        if op == "all_gather":
            outs = [torch.empty_like(t) for _ in range(gs)]
            return dist.all_gather(outs, t, group=group, async_op=asy), lambda: torch.cat(outs)
        if op == "reduce_scatter":
            out = torch.empty(a.numel // gs, dtype=t.dtype, device=t.device)
            return dist.reduce_scatter_single(out, t, op=rop, group=group, async_op=asy), lambda: out
        if op == "reduce":
            # non-root: whatever the backend left in the input (Gloo uses it as scratch)
            return dist.reduce(t, dst=root, op=rop, group=group, async_op=asy), lambda: t
        if op == "gather":
            gathered = [torch.empty_like(t) for _ in range(gs)] if self.rank == root else None
            work = dist.gather(t, gathered, dst=root, group=group, async_op=asy)
            return work, lambda: None if gathered is None else torch.cat(gathered)
        if op == "scatter":
            out = torch.empty(a.numel // gs, dtype=t.dtype, device=t.device)
            chunks = list(t.chunk(gs)) if self.rank == root else None
            return dist.scatter(out, chunks, src=root, group=group, async_op=asy), lambda: out
        if op == "all_to_all":
            out = torch.empty_like(t)
            return dist.all_to_all_single(out, t, group=group, async_op=asy), lambda: out
        return dist.barrier(group=group, async_op=asy), lambda: None

    def _p2p(self, a: P2P) -> None:
        t = self._tensor(a.numel, a.dtype, a.value)
        self.p2p_seq += 1
        rec = P2PRecord(time.time_ns(), a.op, a.numel, a.dtype, a.peer, a.origin, not a.blocking, self.p2p_seq,
                        wait=a.wait)
        self.marks.p2p.append(rec)

        def done() -> None:
            rec.t_done_ns = time.time_ns()
            self._observe(a.observe, t)

        sending = a.op == "send"
        if a.blocking:
            if sending:
                dist.send(t, dst=a.peer, tag=a.tag)
            else:
                dist.recv(t, src=a.peer, tag=a.tag)
            done()
            return
        work = dist.isend(t, dst=a.peer, tag=a.tag) if sending else dist.irecv(t, src=a.peer, tag=a.tag)
        if a.wait == "end_of_iteration":
            self.deferred.append((work, done))
        else:
            work.wait()
            done()
