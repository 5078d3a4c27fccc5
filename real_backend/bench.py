"""nccl-tests-style collective sweeps on the real torch.distributed backend.

Usage from Python::

    from real_backend.bench import run_sweep
    from simdist.timing.sweeps import geometric_sizes
    rows = run_sweep("all_reduce", world_size=2, sizes=geometric_sizes(1024, 64 << 20))

Every rank is its own process (``python -m real_backend.bench --worker CONFIG``, started
by `simdist.procs`; rendezvous at a store the parent hosts on 127.0.0.1 only); the parent
reads rank 0's results line by line (JSON), drives the progress callback, and kills every
child it started when the sweep ends, fails or times out.

Method, per size (as nccl-tests' all_reduce_perf, with medians because this machine is
small and shared):
  * ``warmup`` untimed operations;
  * the number of iterations per timed batch is chosen so a batch lasts about
    ``target_batch_s`` (agreed across ranks: the maximum of the ranks' choices);
  * ``repeats`` batches, each started after a barrier, timed with perf_counter; the
    batch time / iters is one sample; a sample is the slowest rank's (MAX over ranks);
  * we report the median sample (and min/max), algbw = S / t and busbw = algbw * factor
    with S and the factor as in nccl-tests' PERFORMANCE.md (`simdist.timing.sweeps`,
    shared with the simulator's explanations).
"""

from __future__ import annotations

import contextlib
import csv
import datetime
import json
import math
import os
import random
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path

from simdist.procs import LocalProcesses, die_with_parent, loopback_store, rank_env, read_lines, with_pythonpath
from simdist.timing.sweeps import algbw_bytes, bus_factor, geometric_sizes

OP_QUANTILES = (0.1, 0.25, 0.5)  # of single operations' times: op_p10, op_p25, op_median (simdist.timing.experiments)

REPO_ROOT = Path(__file__).resolve().parents[1]

BENCH_OPS = ("all_reduce", "all_gather", "reduce_scatter", "broadcast", "reduce", "all_to_all", "barrier")


@dataclass
class BenchRow:
    op: str
    backend: str
    world_size: int
    nbytes: int  # per-rank input bytes (all_gather: per-rank contribution)
    count: int  # elements (float32)
    iters: int
    repeats: int
    time_s: float  # median over repeats of the per-op time (slowest rank)
    min_s: float
    max_s: float
    algbw_gbps: float  # GB/s (1e9 bytes)
    busbw_gbps: float
    samples_s: list[float] = field(default_factory=list)  # per-batch mean op time (slowest rank)
    sweep: str = ""
    op_quantiles_s: list[float] = field(default_factory=list)  # OP_QUANTILES of single ops (slowest rank)

    def to_dict(self) -> dict:
        return asdict(self)




def run_sweep(
    op: str = "all_reduce",
    world_size: int = 2,
    sizes: list[int] | None = None,
    backend: str = "gloo",
    warmup: int = 5,
    repeats: int = 11,
    target_batch_s: float = 0.03,
    min_iters: int = 5,
    max_iters: int = 1000,
    seed: int | None = None,
    timeout_s: float = 600.0,
    sweep: str = "",
    pin: bool = False,
    progress: Callable[[int, int, BenchRow], None] | None = None,
) -> list[BenchRow]:
    """Run one sweep in fresh processes and return one row per size (sorted by size).

    ``seed`` shuffles the order in which sizes are measured (drift on a shared machine
    then does not line up with size); None keeps ascending order. ``pin`` binds rank i
    to CPU i mod ncpu.
    """
    cfg = _sweep_config(op, world_size, sizes, backend, seed, warmup=warmup, repeats=repeats,
                        target_batch_s=target_batch_s, min_iters=min_iters, max_iters=max_iters, sweep=sweep, pin=pin)
    n_sizes = len(cfg["sizes"])
    rows: list[BenchRow] = []

    def take(d: dict) -> None:
        rows.append(BenchRow(**d))
        if progress is not None:
            progress(len(rows), n_sizes, rows[-1])

    run_ranks("real_backend.bench", cfg, world_size, timeout_s, take, what="bench sweep")
    return sorted(rows, key=lambda r: r.nbytes)


def run_ranks(module: str, cfg: dict, world_size: int, timeout_s: float, on_row: Callable[[dict], None],
              what: str = "bench") -> None:
    """Start `world_size` ranks of ``python -m MODULE --worker CFG`` (one process each,
    rendezvous at a loopback store), hand every JSON line rank 0 prints to `on_row`, and
    end every process, whatever happens (`simdist.procs.LocalProcesses`)."""
    store = loopback_store(world_size, timeout_s)  # rendezvous; the ranks connect to it
    deadline = time.monotonic() + timeout_s
    with LocalProcesses() as procs, contextlib.ExitStack() as files:
        errs = [files.enter_context(tempfile.TemporaryFile()) for _ in range(world_size)]
        for rank in range(world_size):
            env = with_pythonpath(rank_env(rank, world_size, store.port), REPO_ROOT)
            env.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
            procs.start([sys.executable, "-m", module, "--worker", json.dumps(cfg)], env=env,
                        cwd=REPO_ROOT, stdout=subprocess.PIPE if rank == 0 else subprocess.DEVNULL, stderr=errs[rank])
        lead = procs.procs[0].popen
        assert lead.stdout is not None
        try:
            for line in read_lines(lead.stdout, deadline):
                line = line.strip()
                if line.startswith("{"):
                    on_row(json.loads(line))
        except TimeoutError:
            raise TimeoutError(f"{what} exceeded {timeout_s:.0f} s") from None
        for p in procs.procs:
            p.popen.wait(timeout=max(1.0, deadline - time.monotonic()))
        _raise_for_failed_rank([p.returncode for p in procs.procs], errs, what)
    del store


def _sweep_config(op: str, world_size: int, sizes: list[int] | None, backend: str, seed: int | None,
                  **knobs: object) -> dict:
    """Validate a sweep and the config every rank gets (sizes rounded to the op's unit,
    shuffled by `seed`)."""
    if op not in BENCH_OPS:
        raise ValueError(f"op: unknown op {op!r} (choose from {', '.join(BENCH_OPS)})")
    if world_size < 1:
        raise ValueError("ranks: world size must be >= 1")
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend: unknown backend {backend!r} (choose from gloo, nccl)")
    sizes = sorted(set(sizes or geometric_sizes()))
    unit = 4 * (world_size if op in ("reduce_scatter", "all_to_all") else 1)
    sizes = sorted({max(unit, (s // unit) * unit) for s in sizes}) if op != "barrier" else [0]
    order = list(sizes)
    if seed is not None:
        random.Random(seed).shuffle(order)
    return {"op": op, "backend": backend, "sizes": order, **knobs}


def _raise_for_failed_rank(returncodes: list[int | None], errs: list, what: str = "bench") -> None:
    """RuntimeError naming the first rank that failed, with the tail of its stderr."""
    bad = [(r, rc) for r, rc in enumerate(returncodes) if rc != 0]
    if bad:
        r, rc = bad[0]
        errs[r].seek(0)
        tail = errs[r].read().decode(errors="replace").strip().splitlines()[-3:]
        raise RuntimeError(f"{what} rank {r} exited with {rc}: {' | '.join(tail)}")


def save_rows(rows: list[BenchRow], path: str | Path) -> Path:
    """Write rows as CSV (``.csv``) or JSON (anything else)."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    if path.suffix == ".csv":
        with path.open("w", newline="") as f:
            keys = [k for k in BenchRow.__dataclass_fields__ if k not in ("samples_s", "op_quantiles_s")]
            w = csv.DictWriter(f, fieldnames=keys)
            w.writeheader()
            for r in rows:
                d = r.to_dict()
                d.pop("samples_s")
                d.pop("op_quantiles_s")
                w.writerow(d)
    else:
        path.write_text(json.dumps([r.to_dict() for r in rows], indent=1))
    return path


# --------------------------------------------------------------------------- worker side
def join_gloo_world() -> tuple[int, int]:  # pragma: no cover - runs in child processes
    """A measuring rank's start on Gloo (calibration and probes): it dies with its parent, runs
    torch on one thread (ranks share this host's cores; a multi-threaded op would measure the
    machine's thread pool, not Gloo), and joins the store the parent hosts on 127.0.0.1
    (`simdist.procs.loopback_store`). Returns (rank, world size)."""
    die_with_parent()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    rank, p = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), p, is_master=False,
                          timeout=datetime.timedelta(seconds=300))
    dist.init_process_group("gloo", rank=rank, world_size=p, store=store)
    return rank, p


def _worker(cfg: dict) -> None:  # pragma: no cover - runs in child processes
    die_with_parent()
    import torch
    import torch.distributed as dist

    torch.set_num_threads(1)
    backend = cfg["backend"]
    rank, p = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    if cfg.get("pin") and hasattr(os, "sched_setaffinity"):
        cpus = sorted(os.sched_getaffinity(0))
        os.sched_setaffinity(0, {cpus[rank % len(cpus)]})
    device = "cpu"
    if backend == "nccl":
        device = f"cuda:{rank % torch.cuda.device_count()}"
        torch.cuda.set_device(device)
    # the parent hosts the store on 127.0.0.1 (simdist.procs.loopback_store)
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), p, is_master=False,
                          timeout=datetime.timedelta(seconds=300))
    dist.init_process_group(backend, rank=rank, world_size=p, store=store)
    try:
        for nbytes in cfg["sizes"]:
            row = _measure(cfg, nbytes, rank, p, device)
            if row is not None:
                print(json.dumps(row.to_dict()), flush=True)
    finally:
        dist.destroy_process_group()


def _measure(cfg: dict, nbytes: int, rank: int, p: int, device: str) -> BenchRow | None:  # pragma: no cover - child side
    """Time one size on every rank; rank 0 gets the row (slowest rank's times), others None."""
    import numpy as np
    import torch
    import torch.distributed as dist

    op, backend = cfg["op"], cfg["backend"]
    sync = torch.cuda.synchronize if backend == "nccl" else (lambda: None)
    count = max(1, nbytes // 4)
    fn = _make_op(op, count, p, rank, device)
    for _ in range(cfg["warmup"]):
        fn()
    sync()
    t0 = time.perf_counter()
    for _ in range(3):
        fn()
    sync()
    est = max((time.perf_counter() - t0) / 3, 1e-6)
    iters = min(cfg["max_iters"], max(cfg["min_iters"], math.ceil(cfg["target_batch_s"] / est)))
    it_t = torch.tensor([float(iters)], device=device)
    dist.all_reduce(it_t, op=dist.ReduceOp.MAX)
    iters = int(it_t.item())
    samples = []
    ops: list[float] = []
    pc = time.perf_counter
    for _ in range(cfg["repeats"]):
        dist.barrier()
        sync()
        t0 = pc()
        last = t0
        for _ in range(iters):
            fn()
            if backend != "nccl":
                now = pc()
                ops.append(now - last)
                last = now
        sync()
        samples.append((pc() - t0) / iters)
    st = torch.tensor(samples, dtype=torch.float64, device=device)
    dist.all_reduce(st, op=dist.ReduceOp.MAX)
    samples = [float(x) for x in st.cpu().tolist()]
    # p10, p25, p50 of single operations; "lower": a measured value, never an interpolation
    q = torch.tensor(
        np.quantile(ops, OP_QUANTILES, method="lower").tolist() if ops else [0.0] * len(OP_QUANTILES),
        dtype=torch.float64,
        device=device,
    )
    dist.all_reduce(q, op=dist.ReduceOp.MAX)
    op_q = [float(x) for x in q.cpu().tolist()] if ops else []
    if rank != 0:
        return None
    med = statistics.median(samples)
    algbw = algbw_bytes(op, nbytes, p) / med / 1e9 if med > 0 else 0.0
    return BenchRow(op=op, backend=backend, world_size=p, nbytes=nbytes, count=count, iters=iters,
                    repeats=cfg["repeats"], time_s=med, min_s=min(samples), max_s=max(samples), algbw_gbps=algbw,
                    busbw_gbps=algbw * bus_factor(op, p), samples_s=samples, sweep=cfg.get("sweep", ""),
                    op_quantiles_s=op_q)


def _make_op(op: str, count: int, p: int, rank: int, device: str):  # pragma: no cover - child side
    import torch
    import torch.distributed as dist

    if op == "all_reduce":
        t = torch.zeros(count, device=device)
        return lambda: dist.all_reduce(t)
    if op == "broadcast":
        t = torch.zeros(count, device=device)
        return lambda: dist.broadcast(t, src=0)
    if op == "reduce":
        t = torch.zeros(count, device=device)
        return lambda: dist.reduce(t, dst=0)
    if op == "all_gather":
        t = torch.zeros(count, device=device)
        outs = [torch.zeros(count, device=device) for _ in range(p)]
        return lambda: dist.all_gather(outs, t)
    if op == "reduce_scatter":
        inp = torch.zeros(count, device=device)
        out = torch.zeros(count // p, device=device)
        return lambda: dist.reduce_scatter_tensor(out, inp)
    if op == "all_to_all":
        inp = torch.zeros(count, device=device)
        out = torch.zeros(count, device=device)
        return lambda: dist.all_to_all_single(out, inp)
    if op == "barrier":
        return dist.barrier
    raise ValueError(op)


def worker_main(worker: Callable[[dict], None], module: str, command: str) -> None:  # pragma: no cover
    """The `python -m MODULE --worker CONFIG` entry of a module whose ranks `run_ranks` starts."""
    if len(sys.argv) == 3 and sys.argv[1] == "--worker":
        worker(json.loads(sys.argv[2]))
    else:
        print(f"usage: python -m {module} --worker CONFIG (internal); use `simdist {command}`")
        sys.exit(2)


if __name__ == "__main__":  # pragma: no cover
    worker_main(_worker, "real_backend.bench", "bench")
