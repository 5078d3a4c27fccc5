"""Random scenarios for the simulator-vs-real-Gloo fidelity sweep (bench/fidelity_sweep.py,
tests/test_fidelity.py): DDP with random parameter sizes, buffers, bucket caps,
find_unused_parameters, no_sync; ZeRO; Counter/AllReducer; raw collectives with conditions;
Join options in random order; exit/stay at the end; world sizes 2-4; 0-4 inputs per rank; and
the scenario language's constructs: offsets, negated and combined conditions, per-rank compute
times, `stop` on a rank's own condition or on an all-reduced flag, DDP on a subgroup.

`random_scenario(rng, name)` is a function of `rng` and `name` only: the sweep's scenario k of
seed S is the k-th draw from `random.Random(S)` named `sweep{S}_{k}` (`sweep_scenario`), so
a disagreement found by the sweep can be regenerated alone.
"""

from __future__ import annotations

import random
from typing import Any


def sweep_scenario(seed: int, index: int) -> dict[str, Any]:
    """Scenario `index` of the sweep with `seed` (the draws before it are made and dropped)."""
    rng = random.Random(seed)
    for k in range(index):
        random_scenario(rng, f"sweep{seed}_{k}")
    return random_scenario(rng, f"sweep{seed}_{index}")


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
