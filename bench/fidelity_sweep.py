"""Sim-vs-real agreement on random scenarios: the simulator's broadest fidelity check.

Generates N random scenarios (DDP with random parameter sizes, buffers, bucket caps,
find_unused_parameters, no_sync; ZeRO; Counter/AllReducer; raw collectives with conditions;
Join options in random order; exit/stay at the end; world sizes 2-4; 0-4 inputs per rank;
and the scenario language's constructs: offsets, negated and combined conditions, per-rank
compute times, `stop` on a rank's own condition or on an all-reduced flag, DDP on a subgroup),
runs each in the simulator and on real Gloo, and prints the agreement rate. Scenarios that
disagree are written to --out for `simdist compare` to replay.

    python bench/fidelity_sweep.py --seed 2 --n 20 [--out fidelity-failures]
"""

from __future__ import annotations

import argparse
import random
import sys
import time
from pathlib import Path
from typing import Any

import tomli_w


def random_scenario(rng: random.Random, name: str) -> dict[str, Any]:
    w = rng.choice([2, 2, 3, 4])
    d: dict[str, Any] = {"name": name, "world_size": w, "timeout_s": 4,
                         "inputs": {"counts": [rng.randint(0, 4) for _ in range(w)]},
                         "on_finish": rng.choice(["exit", "stay"])}
    loop: list[dict[str, Any]] = []
    joinables: list[str] = []
    use_ddp = rng.random() < 0.7
    if use_ddp:
        model: dict[str, Any] = {"params": [rng.choice([1, 3, 8, 40]) for _ in range(rng.randint(1, 3))]}
        if rng.random() < 0.3:
            model["buffers"] = [rng.choice([1, 4])]
        if rng.random() < 0.3:
            model["bucket_cap_mb"] = rng.choice([1e-5, 5e-5])
        if rng.random() < 0.25:
            model["find_unused_parameters"] = True
        d["model"] = model
        forward: dict[str, Any] = {"kind": "forward"}
        if rng.random() < 0.2:
            forward.update(no_sync=True, below=1)
        loop += [forward, {"kind": "backward"}]
        if rng.random() < 0.5:
            d["optimizer"] = {"kind": "sgd", "zero": rng.random() < 0.6}
            loop.append({"kind": "optimizer_step"})
            if d["optimizer"]["zero"]:
                joinables.append("zero")
        joinables.insert(0, "ddp")
    if rng.random() < 0.4 or not use_ddp:
        d["joinables"] = [{"name": "c", "kind": rng.choice(["counter", "allreducer"])}]
        loop.append({"kind": "joinable_call", "joinable": "c"})
        joinables.append("c")
    if rng.random() < 0.35:
        st: dict[str, Any] = {"kind": "collective", "op": rng.choice(["all_reduce", "broadcast", "all_gather", "barrier"]),
                              "numel": rng.choice([1, 2, 4]), "value": "rank", "observe": "u"}
        if rng.random() < 0.5:
            st["every"] = 2
        loop.insert(rng.randint(0, len(loop)), st)
    d["loop"] = loop
    if joinables and rng.random() < 0.8:
        if rng.random() < 0.2:
            rng.shuffle(joinables)
        d["join"] = {"joinables": joinables, "throw_on_early_termination": rng.random() < 0.2,
                     "enabled": rng.random() < 0.9, "kwargs": {"sync_max_count": True, "run_post_hooks": True}}
    if rng.random() < 0.2:
        d["after"] = [{"kind": "collective", "op": "barrier"}]
    _language(d, random.Random(name))  # its own stream: the draws above stay what they were
    return d


def _language(d: dict[str, Any], rng: random.Random) -> None:
    """The scenario language's constructs, each now and then, on top of a random scenario."""
    w, loop = d["world_size"], d["loop"]
    for st in loop:
        if st.get("every") == 2 and rng.random() < 0.5:
            st["offset"] = 1
        elif st.get("kind") == "collective" and rng.random() < 0.3:
            st["not"] = {"every": 3, "offset": rng.randint(0, 2)}
    if rng.random() < 0.3:
        loop.insert(0, {"kind": "compute", "seconds": [rng.choice([0.0, 0.002, 0.01]) for _ in range(w)]})
    r = rng.randrange(w)
    if rng.random() < 0.2:  # a stop decided together: an all-reduced flag, then break on it
        loop[:0] = [{"kind": "collective", "op": "all_reduce", "reduce_op": "max", "observe": "stop",
                     "value": {"when": {"ranks": [r], "from_iteration": rng.randint(0, 2)}, "then": 1, "else": 0}},
                    {"kind": "stop", "flag": "stop"}]
    elif rng.random() < 0.15:  # a rank that breaks out on its own
        loop.insert(rng.randint(0, len(loop)), {"kind": "stop", "ranks": [r], "from_iteration": rng.randint(0, 2)})
    if "model" in d and w >= 3 and rng.random() < 0.25:  # DDP (and ZeRO) on a subgroup
        d["groups"] = [{"name": "sub", "ranks": sorted(rng.sample(range(w), w - 1))}]
        d["model"]["group"] = "sub"
        if "join" in d:  # every joinable must be on the model's group
            d["join"]["joinables"] = [j for j in d["join"]["joinables"] if j != "c"]
            loop[:] = [st for st in loop if st.get("kind") != "joinable_call"]
            d.pop("joinables", None)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--n", type=int, default=10)
    ap.add_argument("--out", type=Path, default=Path("fidelity-failures"))
    a = ap.parse_args()
    from real_backend.launch import run_real
    from real_backend.workers import WorkerZygote
    from simdist.compare import compare_reports, format_comparison
    from simdist.scenario import parse_scenario
    from simdist.sim import simulate

    rng = random.Random(a.seed)
    agree = 0
    t0 = time.monotonic()
    with WorkerZygote() as zygote:  # torch imported once for the whole sweep
        for k in range(a.n):
            d = random_scenario(rng, f"sweep{a.seed}_{k}")
            s = parse_scenario(d)
            cmp = compare_reports(simulate(s), run_real(s, zygote=zygote))
            agree += cmp.agree
            print(f"{d['name']}: {'agree' if cmp.agree else 'DIFFER'} ({simulate(s).outcome})", flush=True)
            if not cmp.agree:
                a.out.mkdir(parents=True, exist_ok=True)
                (a.out / f"{d['name']}.toml").write_text(tomli_w.dumps(d))
                print(format_comparison(cmp))
    print(f"agreement: {agree}/{a.n} random scenarios ({agree / max(a.n, 1):.0%}) in {time.monotonic() - t0:.0f} s, "
          f"seed {a.seed}")
    return 0 if agree == a.n else 1


if __name__ == "__main__":
    sys.exit(main())
