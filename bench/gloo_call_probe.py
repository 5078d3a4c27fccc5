"""Is the calibrated call cost what a small collective pays? (issue 13, diagnosis only)

Two Gloo ranks measure, interleaved in the same blocks (`real_backend.calibrate`'s
`_timed_passes`: one batch of each quantity per block, the 25th percentile of all calls), the
calibration's primitives at the smallest size (ping-pong one-way, two-in-flight exchange,
barrier, all_reduce on a one-rank group) and, beside them, small collectives at 2 ranks
(broadcast, all_to_all, all_gather, all_reduce, and gather and scatter, which the model
does not time). Then per collective: measured, the Gloo model's time from the primitives
of the same blocks with the call as the calibration prices it (barrier less exchange) and
with the one-rank hand-off, and the call the measurement implies (measured less the model
with no call). Nothing here feeds a calibration: it shows, within one run (ratios hold
under load where absolute times do not), whether barrier - exchange is the fixed cost a
collective pays.

    python bench/gloo_call_probe.py [--blocks 15] [--nbytes 1024]
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import sys

from real_backend.bench import join_gloo_world, run_ranks, worker_main
from real_backend.calibrate import _exchange, _ping, _timed_passes, block_summary, call_cost
from simdist.network.gloo_time import gloo_op_time
from simdist.network.host import HostProfile

MODELLED = ("broadcast", "all_to_all", "all_gather", "all_reduce")


def _worker(cfg: dict) -> None:  # pragma: no cover - runs in child processes
    import torch
    import torch.distributed as dist

    rank, p = join_gloo_world()
    own, _ = dist.new_subgroups(group_size=1)
    try:
        n = cfg["nbytes"] // 4
        small, t = torch.zeros(64), torch.zeros(n)
        out, outs = torch.zeros(n), [torch.zeros(n) for _ in range(p)]
        x = torch.zeros(1)
        jobs = {
            "one_way": (_ping(small, rank, 1 - rank, 0), 2),
            "exchange": (_exchange(small, torch.zeros(64), 1 - rank), 1),
            "barrier": (dist.barrier, 1),
            "hand_off": (lambda: dist.all_reduce(x, group=own), 1),
            "broadcast": (lambda: dist.broadcast(t, 0), 1),
            "all_to_all": (lambda: dist.all_to_all_single(out, t), 1),
            "all_gather": (lambda: dist.all_gather(outs, t), 1),
            "all_reduce": (lambda: dist.all_reduce(t), 1),
            "gather": (lambda: dist.gather(t, outs if rank == 0 else None, dst=0), 1),
            "scatter": (lambda: dist.scatter(out, outs if rank == 0 else None, src=0), 1),
        }
        got = _timed_passes(jobs, {"repeats": cfg["blocks"], "target_batch_s": 0.02})
        if rank == 0:
            import json

            print(json.dumps(got), flush=True)
    finally:
        dist.destroy_process_group()


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--blocks", type=int, default=15)
    ap.add_argument("--nbytes", type=int, default=1024, help="the collectives' per-rank tensor")
    args = ap.parse_args()
    got: dict = {}
    run_ranks("bench.gloo_call_probe", {"blocks": args.blocks, "nbytes": args.nbytes}, 2, 300, got.update,
              what="call probe")
    med = {k: (v["all"], block_summary(v["blocks"])[1]) for k, v in got.items()}  # as the calibration keeps them
    for k, (m, s) in med.items():
        print(f"  {k:>10}: {m * 1e6:8.1f} us  (block spread {s:.2f})")
    call = call_cost(got["barrier"]["blocks"], got["exchange"]["blocks"], got["hand_off"]["blocks"])[0]
    hand = med["hand_off"][0]
    print(f"  call as calibrated (barrier - exchange, paired per block): {call * 1e6:.1f} us; "
          f"one-rank hand-off {hand * 1e6:.1f} us")
    a, e = med["one_way"][0], med["exchange"][0]
    host = HostProfile(os.cpu_count() or 1, call, [256, 1 << 20], [a, a], [a, a], [e, e], 0.0, 0.0)
    print(f"\n{'op (p=2)':>12} {'measured':>10} {'model, call=barrier-exch':>26} {'model, call=hand-off':>22} "
          f"{'implied call':>13}")
    for op in MODELLED:
        m = med[op][0]
        at = {c: gloo_op_time(dataclasses.replace(host, call_s=c), op, args.nbytes, 2) for c in (call, hand, 0.0)}
        print(f"{op:>12} {m * 1e6:8.1f}us {at[call] * 1e6:10.1f}us ({(at[call] - m) / m * 100:+6.1f}%) "
              f"{at[hand] * 1e6:10.1f}us ({(at[hand] - m) / m * 100:+6.1f}%) {(m - at[0.0]) * 1e6:10.1f}us")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker_main(_worker, "bench.gloo_call_probe", "calibrate")
    else:
        sys.exit(main())
