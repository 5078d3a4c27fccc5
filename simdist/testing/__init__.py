"""Input generators for testing simdist itself, shared by tests/ and bench/ (as `torch.testing`
and `hypothesis.extra` ship theirs): each is a function of a `random.Random`, so a test can
drive it with hypothesis and a benchmark with a seed, and both import it by name.

* `simdist.testing.fidelity`: random scenarios for the simulator-vs-real-Gloo sweep.
* `simdist.testing.malformed`: malformed and adversarial scenario/template inputs.
* `simdist.testing.workloads`: fixed benchmark workloads (DDP + ZeRO under Join at any size).
"""
