"""Fixed benchmark workloads (bench/sim_speed.py, bench/scale_ddp.py): one definition, so the
speed and the scale benchmarks measure the same program."""

from __future__ import annotations

from simdist.scenario import Scenario, parse_scenario


def ddp_zero_join(ranks: int, iterations: int) -> Scenario:
    """DDP (3 buckets after the rebuild) + ZeRO Adam under Join, uneven inputs so that shadowing
    is part of the work: `ranks` ranks, about `iterations` iterations each."""
    return parse_scenario({
        "name": "bench_ddp_zero_8x1000",
        "world_size": ranks,
        "inputs": {"counts": [iterations - (r % 3) for r in range(ranks)]},  # uneven: shadowing included
        # three 1.2 MB parameters with a 1 MiB bucket cap: 3 buckets after the rebuild
        "model": {"params": [300_000, 300_000, 300_000], "bucket_cap_mb": 1},
        "optimizer": {"kind": "adam", "zero": True},
        "join": {"joinables": ["ddp", "zero"]},
        "loop": [{"kind": "forward"}, {"kind": "backward"}, {"kind": "optimizer_step"}],
    })
