"""How much core time does a Gloo message cost? (issue 13, diagnosis of the turn-taking model)

`world` Gloo ranks time, per call, the wall clock and the CPU time of the whole process
(`time.process_time`: every thread, i.e. the caller, ProcessGroupGloo's worker threads and
the tcp device's loop thread) of: a ping-pong between ranks 0 and 1 (the rest idle), the
two-in-flight exchange, and small collectives on all ranks. A rank's CPU per call, summed
over ranks and divided by the cores, is a lower bound on a call's wall time when ranks
outnumber cores: the quantity the model's processor sharing divides.

    python bench/gloo_cpu_probe.py --world 2 [--nbytes 2896] [--calls 400]
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

from real_backend.bench import join_gloo_world, run_ranks, worker_main


def _worker(cfg: dict) -> None:  # pragma: no cover - runs in child processes
    import torch
    import torch.distributed as dist

    rank, p = join_gloo_world()
    pair = dist.new_group([0, 1])
    pairs = [dist.new_group([i, i + 1]) for i in range(0, p - 1, 2)]  # every rank creates every group
    mine = pairs[rank // 2] if rank // 2 < len(pairs) else None
    try:
        n = cfg["nbytes"] // 4 // p * p  # all_to_all_single needs a multiple of p
        small, r64, t = torch.zeros(64), torch.zeros(64), torch.zeros(n)
        out, outs = torch.zeros(n), [torch.zeros(n) for _ in range(p)]

        def ping():
            if rank == 0:
                dist.send(small, 1), dist.recv(small, 1)
            elif rank == 1:
                dist.recv(small, 0), dist.send(small, 0)

        def pings():  # every pair (0,1), (2,3), ... ping-pongs at once: more ranks than cores when p > cores
            peer = rank ^ 1
            if peer >= p:
                return
            a, b = (dist.send, dist.recv) if rank % 2 == 0 else (dist.recv, dist.send)
            a(small, peer), b(small, peer)

        def pair_barriers():  # ProcessGroupGloo's worker-thread path on 2-rank groups, all pairs at once
            if mine is not None:
                dist.barrier(group=mine)

        def exchange():
            if rank < 2:
                for q in [dist.isend(small, 1 - rank, group=pair), dist.irecv(r64, 1 - rank, group=pair)]:
                    q.wait()

        def ring_step():  # every rank sends to the next and receives from the previous: one step of a ring
            reqs = [dist.isend(small, (rank + 1) % p), dist.irecv(r64, (rank - 1) % p)]
            for q in reqs:
                q.wait()

        jobs = {"ring step (p2p)": ring_step, "ping_pong (2 messages)": ping, "pair ping_pongs (2 msgs)": pings, "exchange": exchange, "pair barriers": pair_barriers,
                "barrier": dist.barrier,
                "broadcast": lambda: dist.broadcast(t, 0), "all_to_all": lambda: dist.all_to_all_single(out, t),
                "all_gather": lambda: dist.all_gather(outs, t), "all_reduce": lambda: dist.all_reduce(t)}
        res = {}
        for name, fn in jobs.items():
            for _ in range(20):
                fn()
            dist.barrier()
            walls, cpus = [], []
            for _ in range(cfg["calls"]):
                w0, c0 = time.perf_counter(), time.process_time()
                fn()
                walls.append(time.perf_counter() - w0)
                cpus.append(time.process_time() - c0)
            dist.barrier()
            res[name] = [statistics.quantiles(walls, n=4)[0], statistics.median(cpus), statistics.median(walls)]
        got = [None] * p
        dist.all_gather_object(got, res)
        if rank == 0:
            print(json.dumps({"ranks": got}), flush=True)
    finally:
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--world", type=int, default=2)
    ap.add_argument("--nbytes", type=int, default=2896)
    ap.add_argument("--calls", type=int, default=400)
    args = ap.parse_args()
    got: dict = {}
    run_ranks("bench.gloo_cpu_probe", {"nbytes": args.nbytes, "calls": args.calls}, args.world, 600, got.update,
              what="cpu probe")
    ranks = got["ranks"]
    cores = len(os.sched_getaffinity(0))
    print(f"world {args.world}, {cores} cores, {args.nbytes} B; per call: wall p25 and median (slowest rank), CPU median per rank, "
          f"CPU summed over ranks / cores")
    for name in ranks[0]:
        wall = max(r[name][0] for r in ranks)
        cpu = [r[name][1] for r in ranks]
        mean = max(r[name][2] for r in ranks)
        print(f"  {name:>24}: wall {wall * 1e6:8.1f} us (median {mean * 1e6:8.1f})  cpu/rank " + " ".join(f"{c * 1e6:6.1f}" for c in cpu)
              + f"  sum/cores {sum(cpu) / cores * 1e6:8.1f} us")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(_worker, "bench.gloo_cpu_probe", "calibrate")
    else:
        sys.exit(main())
